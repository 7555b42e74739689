import os

# pytester points HOME at a fresh folder for every inner run, so DeepSpeed would JIT-build its ops
# (cpu_adam: a minute or more) again in each one. One build cache for the whole session:
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions"))
