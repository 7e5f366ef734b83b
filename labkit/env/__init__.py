"""Where the labs run: the profiles and their sizes, the gpu profile fitted to free memory, the GPU probe, the
doctor, and the processes a sharded step runs on."""
