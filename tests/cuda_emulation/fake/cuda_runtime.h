// Stands in for the CUDA runtime header in the emulated build (emulation.h): the kernels' launch
// emulation, and the runtime calls cuda_backend.cpp makes, served from host memory by
// ../fake_runtime.cpp (one device; every call completes before it returns, unless
// STRATA_EMULATED_ASYNC turns on the asynchronous mode, in which each stream's work is queued
// and run in a random order that only stream order and events constrain).
// tests/cuda_emulation/README.md says what that can and cannot show.
#pragma once
#include <cstddef>

#include "emulation.h"

// The codes the backend names; values as in driver_types.h.
constexpr cudaError_t cudaSuccess = 0;
constexpr cudaError_t cudaErrorInvalidValue = 1;
constexpr cudaError_t cudaErrorMemoryAllocation = 2;
constexpr cudaError_t cudaErrorNoDevice = 100;
constexpr cudaError_t cudaErrorInvalidDevice = 101;
constexpr cudaError_t cudaErrorNotReady = 600;
constexpr cudaError_t cudaErrorStreamCaptureUnsupported = 900;
constexpr cudaError_t cudaErrorStreamCaptureInvalidated = 901;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
constexpr unsigned cudaStreamNonBlocking = 0x01;
constexpr unsigned cudaEventBlockingSync = 0x01;
constexpr unsigned cudaEventDisableTiming = 0x02;
constexpr unsigned cudaHostAllocPortable = 0x01;

using cudaEvent_t = struct EmulatedEvent*;
// A captured stream's work: its kernels (arguments copied at the launch), copies and GEMMs, in
// order. cudaGraphExec_t is the same list, replayed onto a stream by cudaGraphLaunch.
using cudaGraph_t = struct EmulatedGraph*;
using cudaGraphExec_t = struct EmulatedGraph*;
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
};

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int major, minor, multiProcessorCount;
};

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaGetLastError();
const char* cudaGetErrorName(cudaError_t err);
const char* cudaGetErrorString(cudaError_t err);

cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* ptr);

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
// Later work on `stream` waits for the event's most recent record as of this call (none: no wait).
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
// cudaSuccess once the most recent record has run (or there is none), else cudaErrorNotReady.
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                              size_t rows, cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream = nullptr);

// Stream capture. While a stream captures, work enqueued on it is recorded, not run; waiting for
// it (cudaStreamSynchronize, cudaDeviceSynchronize) or recording events on it fails with
// cudaErrorStreamCaptureUnsupported and invalidates the capture, as on a GPU (events are stricter
// here: CUDA would record them as graph dependencies), so a capture that would break on a GPU
// breaks here too.
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
