"""Type stubs of the native module `weir._weir` (the Rust side of the package).

Application code uses the public modules (`weir`, `weir.consumer`, `weir.producer`,
`weir.llm`); these classes are their implementation.
"""

from typing import Dict

__version__: str

def runtime_threads() -> Dict[str, int]: ...

# --- consumer ---

# --- producer ---
