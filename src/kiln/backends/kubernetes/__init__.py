"""The Kubernetes backend. So far the pure renderer (:mod:`.render`): a job spec → the manifests of one
attempt. The controller that creates them and watches them is the next step (docs/kubernetes.md)."""

from kiln.backends.kubernetes.render import KubeConfig, RenderInput, render, to_yaml

__all__ = ["KubeConfig", "RenderInput", "render", "to_yaml"]
