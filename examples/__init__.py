"""Runnable examples of custom sfbus components, wired by import path like built-in ones."""
