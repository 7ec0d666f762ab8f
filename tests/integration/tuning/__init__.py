"""Studies (hyperparameter tuning)."""
