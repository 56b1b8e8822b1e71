// The emulator's stand-in for the CUDA runtime header (tests/gpu/emu).
#pragma once
#include "../emu_rt.h"
