"""The forward-pass machinery every operator runs through: one capture pass (``capture``), activation patching and
its gradient approximation (``patching``, ``copy_skip``, ``prefix``), set-and-re-read interventions
(``interventions``), steering (``steering``), per-token reward (``per_token``), per-head attention splits
(``attn_heads``), Hessian-vector products and Lanczos (``curvature``, ``lanczos``), re-parameterization
(``reparam``), sparse autoencoders (``sae``) and the ``auto`` batch size (``batch_size``). It reads models through
``models`` (heads, padding, placement) and knows nothing of kinds, runs or the store.
"""
