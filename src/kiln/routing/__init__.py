"""Predict routing: the in-process router that forwards a service's predicts to its ready replicas (router.py), and
its HTTP/1.1 client for replicas on this machine (replica_http.py). The serving task (kiln.tasks.serving) keeps
the replicas; the model services' use cases are kiln.usecases.models.serving."""
