"""Code that runs beside or inside a job. Keep imports here light: the shim starts per job."""
