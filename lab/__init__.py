"""Millwright lab: local emulators for end-to-end tests."""
