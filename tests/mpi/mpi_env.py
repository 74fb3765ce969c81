"""What the MPI test drivers (test_mpi.py, prof_mpi.py, prof_faults_mpi.py) share: the environment
mpirun runs in, and the flag Open MPI needs to start more ranks than cores."""
import os


def mpi_env():
    """os.environ, plus: Open MPI's consent to run as root; for sanitizer builds, LeakSanitizer's
    suppressions of what MPI allocates and keeps until exit (lsan_mpi.supp), and MPI's components
    kept loaded so that their frames have names. Leaks in qk's code are still reported."""
    env = dict(os.environ)
    if hasattr(os, "geteuid") and os.geteuid() == 0:   # Open MPI refuses root without these
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    supp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lsan_mpi.supp")
    env["LSAN_OPTIONS"] = ":".join(o for o in [env.get("LSAN_OPTIONS", ""), "suppressions=" + supp,
                                               "fast_unwind_on_malloc=0", "print_suppressions=0"] if o)
    env["OMPI_MCA_mca_base_component_disable_dlclose"] = "1"
    env["PMIX_MCA_mca_base_component_disable_dlclose"] = "1"
    return env


def oversubscribe(version):
    """mpirun's extra arguments, from what `mpirun --version` printed: Open MPI counts slots per
    core, so 3 ranks on 2 cores need --oversubscribe (MPICH needs nothing)."""
    return ["--oversubscribe"] if ("Open MPI" in version or "OpenRTE" in version) else []
