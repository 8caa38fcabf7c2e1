"""What the API and the workers share beyond the fitting library: summary jobs and what one
does (`jobs`, `precompute`, `outcomes`, `failures`), the service's policy per model window
(`windows`), the broker both speak (`broker`) and the service's calibration rule
(`settling`). Imports neither FastAPI nor Celery."""
