"""One module (or small package) per investigation, each defining ``INVESTIGATION`` (kit.contract).
The registry is ``kit.contract.REGISTRY``; the recipe for a new one is in ``kit/README.md``."""
