"""Applications built on the engine: the RAG debate step (seed 000)."""
