"""Data and storage: datasets and their versions, the stores (a directory, S3), the catalog."""
