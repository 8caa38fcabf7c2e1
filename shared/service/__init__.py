"""What the API and the workers share beyond the fitting library.

Summary jobs and what one does (`jobs`, `precompute`, `outcomes`, `failures`), the service's
policy per model window (`windows`) and the broker both speak (`broker`). Imports neither
FastAPI nor Celery.
"""
