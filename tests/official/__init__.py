"""Benchmarks' own evaluation code, vendored for the tests where its license allows (each file's header names the
repository, commit, file, license and what was changed): the tests load vlbert's result files with it."""
