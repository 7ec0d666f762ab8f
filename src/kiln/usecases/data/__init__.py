"""Data and storage: datasets and their names, uploads and blobs, a job's outputs, who may read an input, the storage
gate."""
