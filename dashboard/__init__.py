"""The kvobs dashboard: a Streamlit app over the store (`kvobs dashboard --store URL`)."""
