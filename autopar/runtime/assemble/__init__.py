"""Building a rank's part of the model: the serial model cut into rows (`rows`), the rows of this
rank's pipeline stages rewritten for tp / sp / recompute (`stages`), their tensors materialised on
the device from the seed, a checkpoint or Hugging Face weights (`materialize`, `weights`,
`pieces`), and the pre-launch check that refuses a plan before any rank starts (`prelaunch`)."""
