// The emulator's stand-in for the cuBLAS header (tests/gpu/emu).
#pragma once
#include "../emu_rt.h"
