import os
import sys

# tests/gpu/_gpu.py is imported as a plain module by the GPU tests.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
