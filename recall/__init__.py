"""Two-tower recall (torch + faiss), the popularity channel and the channel merge."""
