// Stands in for cuBLAS's header in the emulated build: cuda_common.h names its status type.
#pragma once
using cublasStatus_t = int;
