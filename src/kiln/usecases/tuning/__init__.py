"""Hyperparameter tuning: studies and the engine that asks Optuna for trials."""
