"""rbcheck benchmarks.

* ``bench/*.py`` -- the asv benchmark package (``asv.conf.json``:
  ``benchmark_dir = "bench"``); ``bench_buffer.py`` holds the benchmarks.
* ``bench/workload.py`` -- sizes, deterministic data and the result checks
  shared by asv and the micro-benchmarks.
* ``bench/micro/`` -- pytest-benchmark files (not a package, so asv does not
  import them): ``pytest bench/micro``.
* ``bench/ratios.py`` / ``bench/plot.py`` -- ratio table and throughput plot
  from a pytest-benchmark JSON file.

See docs/benchmarks.md.
"""
