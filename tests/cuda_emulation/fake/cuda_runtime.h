// Stands in for the CUDA runtime header in the emulated build (emulation.h).
#pragma once
#include "emulation.h"
