"""The tools/ scripts as modules, for tests of their argument parsing and main functions."""
import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_tool(tool):
    """tools/<tool> (e.g. 'train_net.py') executed as a fresh module."""
    spec = importlib.util.spec_from_file_location(tool[:-3], os.path.join(REPO, 'tools', tool))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
