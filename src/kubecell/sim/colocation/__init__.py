"""Interference-aware sharing end to end in the dynamic simulator (issue 23): co-located jobs run at the speeds
measured pairs give, and admission rules are compared on job completion time and GPU-hours."""
