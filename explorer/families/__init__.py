"""Model families with pieces of their own: the masked-diffusion adapter, the trimmed-head draft, the EAGLE
head and its drafter, Gemma's assistant drafter and block-diffusion sampler. ``explorer.models`` loads them."""
