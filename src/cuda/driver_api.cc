#include "cuda/driver_api.h"

#include <dlfcn.h>

#include <mutex>

namespace amem::cuda {
namespace {

struct Loaded {
  DriverApi api{};
  bool ok = false;
  std::string why;
};

// Looks up `name` (the versioned symbol where the driver has one) into `slot`.
template <typename Fn>
bool Bind(void* library, const char* name, Fn*& slot, std::string& why) {
  slot = reinterpret_cast<Fn*>(dlsym(library, name));
  if (slot == nullptr && why.empty()) {
    why = std::string("libcuda.so.1 has no symbol ") + name + " (driver too old?)";
  }
  return slot != nullptr;
}

Loaded LoadDriver() {
  Loaded loaded;
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    loaded.why = std::string("the CUDA driver (libcuda.so.1) could not be loaded: ") +
                 (error ? error : "unknown error") + ". Is an NVIDIA driver installed";
    return loaded;
  }
  DriverApi& a = loaded.api;
  std::string& w = loaded.why;
  bool ok = true;
  ok &= Bind(library, "cuInit", a.cuInit, w);
  ok &= Bind(library, "cuDriverGetVersion", a.cuDriverGetVersion, w);
  ok &= Bind(library, "cuGetErrorString", a.cuGetErrorString, w);
  ok &= Bind(library, "cuDeviceGetCount", a.cuDeviceGetCount, w);
  ok &= Bind(library, "cuDeviceGet", a.cuDeviceGet, w);
  ok &= Bind(library, "cuDeviceGetAttribute", a.cuDeviceGetAttribute, w);
  ok &= Bind(library, "cuDevicePrimaryCtxRetain", a.cuDevicePrimaryCtxRetain, w);
  ok &= Bind(library, "cuDevicePrimaryCtxRelease_v2", a.cuDevicePrimaryCtxRelease, w);
  ok &= Bind(library, "cuDevicePrimaryCtxGetState", a.cuDevicePrimaryCtxGetState, w);
  ok &= Bind(library, "cuCtxPushCurrent_v2", a.cuCtxPushCurrent, w);
  ok &= Bind(library, "cuCtxPopCurrent_v2", a.cuCtxPopCurrent, w);
  ok &= Bind(library, "cuCtxSynchronize", a.cuCtxSynchronize, w);
  ok &= Bind(library, "cuMemGetInfo_v2", a.cuMemGetInfo, w);
  ok &= Bind(library, "cuMemAlloc_v2", a.cuMemAlloc, w);
  ok &= Bind(library, "cuMemFree_v2", a.cuMemFree, w);
  ok &= Bind(library, "cuMemHostAlloc", a.cuMemHostAlloc, w);
  ok &= Bind(library, "cuMemFreeHost", a.cuMemFreeHost, w);
  ok &= Bind(library, "cuMemcpyAsync", a.cuMemcpyAsync, w);
  ok &= Bind(library, "cuStreamSynchronize", a.cuStreamSynchronize, w);
  ok &= Bind(library, "cuDeviceGetMemPool", a.cuDeviceGetMemPool, w);
  ok &= Bind(library, "cuMemPoolTrimTo", a.cuMemPoolTrimTo, w);
  ok &= Bind(library, "cuMemPoolGetAttribute", a.cuMemPoolGetAttribute, w);
  ok &= Bind(library, "cuMemcpyDtoHAsync_v2", a.cuMemcpyDtoHAsync, w);
  ok &= Bind(library, "cuMemcpyHtoDAsync_v2", a.cuMemcpyHtoDAsync, w);
  ok &= Bind(library, "cuStreamCreate", a.cuStreamCreate, w);
  ok &= Bind(library, "cuDeviceGetPCIBusId", a.cuDeviceGetPCIBusId, w);
  ok &= Bind(library, "cuStreamDestroy_v2", a.cuStreamDestroy, w);
  ok &= Bind(library, "cuStreamQuery", a.cuStreamQuery, w);
  ok &= Bind(library, "cuMemcpyHtoD_v2", a.cuMemcpyHtoD, w);
  ok &= Bind(library, "cuMemcpyDtoH_v2", a.cuMemcpyDtoH, w);
  ok &= Bind(library, "cuIpcGetMemHandle", a.cuIpcGetMemHandle, w);
  ok &= Bind(library, "cuIpcOpenMemHandle_v2", a.cuIpcOpenMemHandle, w);  // cuda.h maps the name to _v2
  ok &= Bind(library, "cuIpcCloseMemHandle", a.cuIpcCloseMemHandle, w);
  ok &= Bind(library, "cuMemGetAddressRange_v2", a.cuMemGetAddressRange, w);
  ok &= Bind(library, "cuPointerGetAttribute", a.cuPointerGetAttribute, w);
  ok &= Bind(library, "cuMemHostRegister_v2", a.cuMemHostRegister, w);
  ok &= Bind(library, "cuMemHostUnregister", a.cuMemHostUnregister, w);
  if (!ok) return loaded;
  CUresult init = a.cuInit(0);
  if (init != kSuccess) {
    const char* text = nullptr;
    a.cuGetErrorString(init, &text);
    w = std::string("cuInit failed: ") + (text ? text : "unknown error") +
        " (no usable NVIDIA GPU?)";
    return loaded;
  }
  loaded.ok = true;
  return loaded;
}

}  // namespace

const DriverApi* Driver(std::string* why) {
  static Loaded* loaded = nullptr;
  static std::once_flag once;
  std::call_once(once, [] { loaded = new Loaded(LoadDriver()); });
  if (why != nullptr) *why = loaded->why;
  return loaded->ok ? &loaded->api : nullptr;
}

Status Check(CUresult result, const char* what) {
  if (result == kSuccess) return Status::Ok();
  const char* text = nullptr;
  const DriverApi* api = Driver();
  if (api != nullptr) api->cuGetErrorString(result, &text);
  return Status::Error(std::string(what) + ": CUDA error " + std::to_string(result) + " (" +
                       (text ? text : "unknown") + ")");
}

ScopedDeviceContext::ScopedDeviceContext(int ordinal) {
  std::string why;
  const DriverApi* api = Driver(&why);
  if (api == nullptr) {
    status_ = Status::Error(why);
    return;
  }
  status_ = Check(api->cuDeviceGet(&device_, ordinal), "cuDeviceGet");
  if (!status_.ok()) return;
  CUcontext context = nullptr;
  status_ = Check(api->cuDevicePrimaryCtxRetain(&context, device_), "cuDevicePrimaryCtxRetain");
  if (!status_.ok()) return;
  retained_ = true;
  status_ = Check(api->cuCtxPushCurrent(context), "cuCtxPushCurrent");
  pushed_ = status_.ok();
}

ScopedDeviceContext::~ScopedDeviceContext() {
  const DriverApi* api = Driver();
  if (api == nullptr) return;
  if (pushed_) {
    CUcontext popped = nullptr;
    api->cuCtxPopCurrent(&popped);
  }
  if (retained_) api->cuDevicePrimaryCtxRelease(device_);
}

}  // namespace amem::cuda
