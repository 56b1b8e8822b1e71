#!/bin/sh
# Adds NVIDIA's CUDA apt repository for Debian 12 (the build stage of the CUDA image; the runtime
# stage copies the keyring and source list from there).
set -eu
curl -fsSL -o /tmp/cuda-keyring.deb \
    https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb
dpkg -i /tmp/cuda-keyring.deb
rm -f /tmp/cuda-keyring.deb
apt-get update
