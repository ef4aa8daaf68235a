"""Trace loaders: public trace files -> core nodes, requests and jobs, with ``file:line`` errors.

``rows.py`` is the one CSV reader every format uses; ``openb.py`` reads the Alibaba GPU trace v2023 node
and pod lists (the packing experiment); ``philly.py`` and ``sia.py`` read job lists for the dynamic
simulator, sharing ``jobs.py``; ``workloads.py`` detects a file's format and loads any mix of job lists.
"""
