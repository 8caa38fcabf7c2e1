"""The `prefit` command line and what it runs.

`cli` (the console script), `up` (the whole service as supervised child processes), the
throwaway `redisproc` and `clusterproc` servers (tests, benchmarks, `prefit up`), `demo`,
`inspect` and `encodingfiles`.
"""
