import os

# The parent process of this process as early as the package can see it (its first import): for a rank
# that torchrun's agent started, the agent. utils/lifetime.py compares it with the parent after asking
# Linux for a parent-death signal, to tell a live agent from one that died before the request.
PARENT_PID_AT_START = os.getppid()
