"""`kvobs report`: one page of a range to hand over (`content` says what, `render` writes it)."""
