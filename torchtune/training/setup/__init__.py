"""A recipe's set-up before the loop: config checks, the model on its device and dtype, the data and its
resumable sampler, and the start-up checks ``tune validate`` runs."""
