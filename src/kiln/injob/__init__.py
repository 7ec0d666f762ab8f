"""What runs in or beside a job: the shim, its sandbox and staging, a replica's server, the metrics SDK. Standard
library only, and keep imports here light: the shim starts per job."""
