"""Models and serving: the registry, where a version's files come from (a job, a run, a logged model), removal, services
and their rollouts."""
