"""Celery workers that compute summary records ahead of time (see worker.app)."""
