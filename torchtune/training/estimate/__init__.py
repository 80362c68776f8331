"""Memory estimation (``tune estimate-memory``): the recipe's own steps run on fake tensors, per phase, for one
device or a world size, and the host RAM / PCIe / CPU-step figures of CPU offload."""
