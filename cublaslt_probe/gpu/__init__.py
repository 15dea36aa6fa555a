"""The only code that runs on the GPU: it imports torch or cupy (inside functions, so that every module
imports on a CPU) or loads CUDA libraries through ctypes (libcublasLt, libcuda, CUPTI). The probe and
its libraries (`probe`, `timing`, `lt`, `driver`, `cupti`), the run recorder (`recorder`), `cold-start`'s runner,
its child processes and the step marker a program imports (`coldstart`, `coldstart_child`, `coldstart_step`), the
child of `first-call` (`firstcall`), and the GPU halves of `audit --measure` and `replay` (`measure`, `replay`)."""
