"""Code generation: kernel plans (``plan``), kernel families (``families``) and one renderer
per target (``llvm`` ...), registered in ``base``."""
