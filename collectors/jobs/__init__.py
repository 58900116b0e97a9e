"""The collector's periodic jobs over what the streams stored: the routing meter (each request's lookup against the
fleet) and the verdict keeper (each settled step's failure cause)."""
