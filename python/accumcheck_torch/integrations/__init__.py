"""Integrations with the trainers that write the accumulation loop for you
(docs/frameworks.md): Transformers' Trainer (`.transformers`), Accelerate
(`.accelerate`), Lightning (`.lightning`).  Each module imports its
framework when it is imported itself; `import accumcheck_torch` imports
none of them."""
