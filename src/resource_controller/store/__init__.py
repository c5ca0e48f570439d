"""The only package that speaks SQL: the controller's state and every operation on it."""
