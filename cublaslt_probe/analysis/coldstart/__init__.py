"""Why was the first step slow? A cold-start breakdown of a whole program, each cause measured (CPU only).

`gpu.coldstart.run(target, steps=…)` (needs a GPU) runs the program's steps in fresh child processes
(`gpu.coldstart_child`), one controlled environment each, and returns what they measured; this package reads it
on any machine: `breakdown.analyse(result)` splits the excess of step 1 over the steady state by cause, each with
its evidence; `render.coldstart.render(analysis)` prints it; `observed.observed_provenance(result)` lists the
kernels the process was seen compiling or loading from PTX. A program marks its steps with
`cublaslt_probe.cold_start_step()`.

The modules, each importing only those above it: `runs` (one run's record read back; `Runs`, the runs of a round
by name and the part each plays), `envs` (the environments and which runs to make), `routes` (the compile routes
the child timed), `observed` (what the process was seen compiling), `causes` (one function per term of the sum
below), `rounds` (`--repeat`: the median runs and the spreads), `breakdown` (`analyse`), `saved` (`load`, the
checks of a saved file), `binding` (what a save measured: program, content hash, GPU, versions; `check_bound`).

The environments are `ENVS` (what each separates: docs/coldstart.md); `--env-set default` runs cold, warm,
preinit, eager and nocache, `full` adds nojit, forcejit and forcejit_warm (`ENV_SETS`); noautotune is added when
the cold run compiled with XLA, cold_again when its step 1 read files from storage (`AUTO_ENVS`). Each run has
its own folder for every compile cache a process may use (`CACHE_DIRS`: ComputeCache, Inductor, Triton, torch's
kernels and extensions, CuPy, Numba, JAX).

The breakdown of the cold run's step 1: excess = step 1 − steady state (median of steps 3…N) =
(cold − warm) + (warm − preinit) + (preinit − eager) + (eager step 1 − steady); the first three are the
cold-cache compilation (split between the framework and PTX JIT by what was written where), initialisation and
module loading; where the cold run's step 1 read files from storage, a cold_again run (empty caches, the
operating system's file cache warm) splits cold − warm into those first reads (cold − cold_again) and the
compilation (cold_again − warm). The last term is split into what was observed inside the eager run's step 1:
cuBLASLt heuristic misses (new problems in the step's level-2 log × the miss time measured by `nocache`) and
allocator growth (time in the driver's allocation calls, seen by CUPTI). The compile routes the child timed
(torch.compile's own timers, CuPy/NVRTC, Triton used directly, Numba, JAX/XLA and XLA's GEMM autotuning) take
their own share of cold − warm (their timers' difference) and their warm-cache cost from the warm run's step 1
(their timers there: framework compilation with warm caches, benchmark-based autotuning, cache lookups and
loads); the differences after cold − warm are taken with each run's timed-route seconds out of its step 1, since
a route that compiles in every run varies between runs by more than those differences measure. What none of these
explains is reported as "unexplained", never dropped: causes + unexplained = step 1 − steady state, exactly. A
difference between two runs below zero is run-to-run noise: the cause counts 0 and the evidence says what was
measured.

`--repeat N` (`run(repeat=)`, default `REPEAT_DEFAULT`) makes the runs in N rounds; the breakdown is that of each
environment's median run (`median_runs`), every figure with its spread over the rounds and causes no larger than
their spread said to be within noise (`combine_rounds`). `load` checks a saved run's values (`check_run`: a damaged
run is skipped with a note) and `check_bound` refuses a save of another program or GPU (docs/coldstart.md).
"""

