// Vulkan start-up: instance (with validation when asked), device choice, queue, pipelines.
#include "backends/vulkan/context.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include "codegen/spirv.hpp"
#include "codegen/spirv_needs.hpp"

namespace qkv::backend {

namespace {
std::atomic<std::uint64_t> g_validation_messages{0};

VKAPI_ATTR VkBool32 VKAPI_CALL on_validation_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT,
                                                     const VkDebugUtilsMessengerCallbackDataEXT* data, void*) {
  if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
    ++g_validation_messages;
    std::fprintf(stderr, "vulkan validation: %s\n", data->pMessage);
  }
  return VK_FALSE;
}

int device_rank(vk::PhysicalDeviceType t) {
  switch (t) {
    case vk::PhysicalDeviceType::eDiscreteGpu: return 0;
    case vk::PhysicalDeviceType::eIntegratedGpu: return 1;
    case vk::PhysicalDeviceType::eVirtualGpu: return 2;
    case vk::PhysicalDeviceType::eCpu: return 3;
    case vk::PhysicalDeviceType::eOther: return 4;
  }
  return 5;
}

constexpr const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";

}  // namespace

std::uint64_t vulkan_validation_messages() { return g_validation_messages.load(); }

namespace {

/// `flag` from environment variable `name` where it is set: 1 or 0, else an error naming it and
/// what it takes (`choices`).
void env_flag(const char* name, bool& flag, const std::string& choices) {
  const char* f = std::getenv(name);
  if (!f) return;
  const std::string s = f;
  if (s != "0" && s != "1") throw BackendError(std::string("vulkan: ") + name + " is '" + s + "'; give " + choices);
  flag = s == "1";
}

}  // namespace

VulkanOptions vulkan_options_from_env() {
  VulkanOptions o;
  if (const char* d = std::getenv("QKV_VULKAN_DEVICE")) o.device_filter = d;
  if (const char* v = std::getenv("QKV_VULKAN_VALIDATION")) o.validation = std::string(v) == "1";
  if (const char* t = std::getenv("QKV_VULKAN_TUNING")) {
    const std::string s = t;
    if (s == "cpu") o.tuning = VulkanOptions::Tuning::cpu;
    else if (s == "gpu") o.tuning = VulkanOptions::Tuning::gpu;
    else if (!s.empty() && s != "auto") throw BackendError("vulkan: QKV_VULKAN_TUNING is '" + s + "'; give cpu, gpu or auto");
  }
  if (const char* g = std::getenv("QKV_VULKAN_ATTENTION_GEOMETRY"); g && *g) {
    unsigned inv = 0, rows = 0, tile = 0;
    char extra = 0;
    if (std::sscanf(g, "%u,%u,%u%c", &inv, &rows, &tile, &extra) != 3 || inv < 1 || inv > 1024 || (inv & (inv - 1)) || rows < 1 || rows > 8 ||
        tile < 1 || tile > 256)
      throw BackendError(std::string("vulkan: QKV_VULKAN_ATTENTION_GEOMETRY is '") + g +
                         "'; give INVOCATIONS,ROWS,TILE (a power of two up to 1024, 1 to 8, 1 to 256)");
    o.attention_invocations = inv;
    o.attention_rows = rows;
    o.attention_tile = tile;
  }
  env_flag("QKV_VULKAN_SPLIT_KV", o.split_kv, "1 (decoding splits the keys, the default) or 0");
  env_flag("QKV_DETERMINISTIC", o.deterministic, "1 (packed batches batch-invariant on every device) or 0 (the default)");
  env_flag("QKV_VULKAN_SUBGROUP_REDUCTIONS", o.subgroup_reductions, "1 (a subgroup per row where the device can, the default) or 0");
  env_flag("QKV_VULKAN_OPTIMIZE_SPIRV", o.optimize_spirv, "1 (spirv-opt's performance passes, the default) or 0");
  env_flag("QKV_VULKAN_HALF_STORAGE", o.half_storage, "1 (16-bit buffers where the device has them, the default) or 0");
  if (const char* f = std::getenv("QKV_VULKAN_COOPERATIVE_MATRIX")) {
    const std::string s = f;
    using C = VulkanOptions::CooperativeMatrix;
    if (s == "auto") o.cooperative_matrix = C::automatic;
    else if (s == "0") o.cooperative_matrix = C::off;
    else if (s == "1") o.cooperative_matrix = C::on;
    else if (s == "emulate") o.cooperative_matrix = C::emulated;
    else if (s == "khr") o.cooperative_matrix = C::khr;
    else
      throw BackendError("vulkan: QKV_VULKAN_COOPERATIVE_MATRIX is '" + s +
                         "'; give auto (where the device has them, the default), 0 (never), 1 (required), khr (VK_KHR_cooperative_matrix required, "
                         "even where VK_NV_cooperative_matrix is offered) or emulate (for tests)");
  }
  env_flag("QKV_VULKAN_FUSION", o.fusion, "1 (fuse, the default) or 0");
  if (const char* g = std::getenv("QKV_VULKAN_MATMUL_GEOMETRY"); g && *g) {
    auto& m = o.matmul_geometry;
    char extra = 0;
    if (std::sscanf(g, "%u,%u,%u,%u,%u%c", &m[0], &m[1], &m[2], &m[3], &m[4], &extra) != 5)
      throw BackendError(std::string("vulkan: QKV_VULKAN_MATMUL_GEOMETRY is '") + g +
                         "'; give INVOCATIONS,ROWS,VEC4_COLUMNS,DEPTH,ACROSS (e.g. 256,8,2,8,16)");
  }
  return o;
}

namespace vulkan {

std::array<std::uint32_t, 3> chosen_fragment(const std::vector<vk::CooperativeMatrixPropertiesNV>& offered) {
  std::array<std::uint32_t, 3> best{};
  for (const auto& p : offered) {
    using C = vk::ComponentTypeNV;
    if (p.AType != C::eFloat16 || p.BType != C::eFloat16 || p.CType != C::eFloat32 || p.DType != C::eFloat32 || p.scope != vk::ScopeNV::eSubgroup)
      continue;
    // The kernel's shared-memory offsets and strides stay 16-byte aligned for multiples of 8.
    if (p.MSize % 8 != 0 || p.NSize % 8 != 0 || p.KSize % 8 != 0 || p.MSize > 32 || p.NSize > 32 || p.KSize > 32) continue;
    const bool square = p.MSize == 16 && p.NSize == 16 && p.KSize == 16;
    if (square || best[0] == 0 || p.MSize * p.NSize * p.KSize > best[0] * best[1] * best[2]) best = {p.MSize, p.NSize, p.KSize};
    if (square) break;
  }
  return best;
}

namespace {

// VK_KHR_cooperative_matrix (Vulkan 1.3.255) is newer than Debian 12's headers (1.3.239): its
// structures and values as the Vulkan registry gives them. Its component types and scopes have
// VK_NV_cooperative_matrix's values.
constexpr const char* kKhrCooperativeMatrix = "VK_KHR_cooperative_matrix";
struct CooperativeMatrixFeaturesKhr {
  VkStructureType sType = static_cast<VkStructureType>(1000506000);
  void* pNext = nullptr;
  VkBool32 cooperativeMatrix = VK_FALSE;
  VkBool32 cooperativeMatrixRobustBufferAccess = VK_FALSE;
};
struct CooperativeMatrixPropertiesKhr {
  VkStructureType sType = static_cast<VkStructureType>(1000506001);
  void* pNext = nullptr;
  std::uint32_t MSize = 0, NSize = 0, KSize = 0;
  VkComponentTypeNV AType{}, BType{}, CType{}, ResultType{};
  VkBool32 saturatingAccumulation = VK_FALSE;
  VkScopeNV scope{};
};
using GetKhrProperties = VkResult(VKAPI_PTR*)(VkPhysicalDevice, std::uint32_t*, CooperativeMatrixPropertiesKhr*);

bool khr_feature(const vk::raii::PhysicalDevice& d) {
  CooperativeMatrixFeaturesKhr khr;
  VkPhysicalDeviceFeatures2 features{};
  features.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
  features.pNext = &khr;
  d.getDispatcher()->vkGetPhysicalDeviceFeatures2(static_cast<VkPhysicalDevice>(*d), &features);
  return khr.cooperativeMatrix == VK_TRUE;
}

/// vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR's offers as NV's structure (same fields and
/// values; ResultType is NV's DType), leaving out saturating ones.
std::vector<vk::CooperativeMatrixPropertiesNV> khr_offers(const vk::raii::Instance& instance, const vk::raii::PhysicalDevice& d) {
  auto get = reinterpret_cast<GetKhrProperties>(instance.getProcAddr("vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"));
  std::uint32_t count = 0;
  if (!get || get(static_cast<VkPhysicalDevice>(*d), &count, nullptr) != VK_SUCCESS) return {};
  std::vector<CooperativeMatrixPropertiesKhr> offers(count);
  const VkResult r = get(static_cast<VkPhysicalDevice>(*d), &count, offers.data());
  if (r != VK_SUCCESS && r != VK_INCOMPLETE) return {};
  offers.resize(count);
  std::vector<vk::CooperativeMatrixPropertiesNV> nv;
  for (const auto& o : offers)
    if (!o.saturatingAccumulation)
      nv.emplace_back(o.MSize, o.NSize, o.KSize, vk::ComponentTypeNV(o.AType), vk::ComponentTypeNV(o.BType), vk::ComponentTypeNV(o.CType),
                      vk::ComponentTypeNV(o.ResultType), vk::ScopeNV(o.scope));
  return nv;
}

bool has_extension(const std::vector<vk::ExtensionProperties>& available, std::string_view name) {
  return std::any_of(available.begin(), available.end(), [&](const auto& e) { return name == e.extensionName.data(); });
}

}  // namespace

MemoryModelSupport memory_model_support(const vk::raii::PhysicalDevice& d) {
  const auto available = d.enumerateDeviceExtensionProperties();
  if (!has_extension(available, VK_KHR_VULKAN_MEMORY_MODEL_EXTENSION_NAME)) return {};
  const auto f =
      d.getFeatures2<vk::PhysicalDeviceFeatures2, vk::PhysicalDeviceVulkanMemoryModelFeatures>().get<vk::PhysicalDeviceVulkanMemoryModelFeatures>();
  return {f.vulkanMemoryModel == VK_TRUE, f.vulkanMemoryModel == VK_TRUE && f.vulkanMemoryModelDeviceScope == VK_TRUE};
}

CooperativeOffer offered_fragment(const vk::raii::Instance& instance, const vk::raii::PhysicalDevice& d, bool prefer_khr) {
  const auto available = d.enumerateDeviceExtensionProperties();
  // The kernels' fragment loads and stores use the Vulkan memory model (GL_KHR_memory_scope_semantics);
  // a device created with it forbids Device scope in every module unless it also allows it
  // (vulkanMemoryModelDeviceScope), and the other kernels' atomics and buffer barriers use it.
  if (!memory_model_support(d).device_scope) return {};
  CooperativeOffer nv, khr;
  if (has_extension(available, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME) &&
      d.getFeatures2<vk::PhysicalDeviceFeatures2, vk::PhysicalDeviceCooperativeMatrixFeaturesNV>()
          .get<vk::PhysicalDeviceCooperativeMatrixFeaturesNV>()
          .cooperativeMatrix) {
    nv.offers = d.getCooperativeMatrixPropertiesNV();
    nv.fragment = chosen_fragment(nv.offers);
  }
  if (has_extension(available, kKhrCooperativeMatrix) && khr_feature(d)) {
    khr.offers = khr_offers(instance, d);
    khr.fragment = chosen_fragment(khr.offers);
    khr.khr = true;
  }
  if (khr.fragment[0] != 0 && (prefer_khr || nv.fragment[0] == 0)) return khr;
  return nv.fragment[0] != 0 ? nv : CooperativeOffer{};
}

SubgroupSupport subgroup_support(const vk::raii::PhysicalDevice& d) {
  SubgroupSupport r;
  if (d.getProperties().apiVersion < VK_API_VERSION_1_1) return r;
  const auto chain = d.getProperties2<vk::PhysicalDeviceProperties2, vk::PhysicalDeviceSubgroupProperties>();
  const auto& sub = chain.get<vk::PhysicalDeviceSubgroupProperties>();
  r.size = sub.subgroupSize;
  if (!(sub.supportedStages & vk::ShaderStageFlagBits::eCompute)) return r;
  using F = vk::SubgroupFeatureFlagBits;
  r.operations = sub.supportedOperations;
  r.arithmetic = static_cast<bool>(sub.supportedOperations & F::eArithmetic);
  r.shuffle = static_cast<bool>(sub.supportedOperations & F::eShuffle);
  r.ballot = static_cast<bool>(sub.supportedOperations & F::eBallot);
  return r;
}

const char* device_type_name(vk::PhysicalDeviceType t) {
  switch (t) {
    case vk::PhysicalDeviceType::eDiscreteGpu: return "discrete";
    case vk::PhysicalDeviceType::eIntegratedGpu: return "integrated";
    case vk::PhysicalDeviceType::eVirtualGpu: return "virtual";
    case vk::PhysicalDeviceType::eCpu: return "cpu";
    case vk::PhysicalDeviceType::eOther: return "other";
  }
  return "?";
}

namespace {
vk::raii::Context make_loader_context() {
  try {
    return vk::raii::Context();
  } catch (const std::exception& e) {
    throw BackendError(std::string("vulkan: no Vulkan loader (install libvulkan1): ") + e.what());
  }
}
}  // namespace

Context::Context(const VulkanOptions& options)
    : context_(make_loader_context()),
      optimization_(options.optimize_spirv ? codegen::SpirvOptimization::performance : codegen::SpirvOptimization::none) {
  guarded("start-up", [&] {
    vk::ApplicationInfo app("qkv", 1, "qkv", 1, VK_API_VERSION_1_1);
    std::vector<const char*> layers, extensions;
    if (options.validation) {
      bool found = false;
      for (const auto& l : context_.enumerateInstanceLayerProperties()) found |= std::string(l.layerName.data()) == kValidationLayer;
      if (!found)
        throw BackendError("vulkan: validation requested but " + std::string(kValidationLayer) + " is not installed (vulkan-validationlayers)");
      layers.push_back(kValidationLayer);
      extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    }
    instance_ = vk::raii::Instance(context_, vk::InstanceCreateInfo({}, &app, layers, extensions));
    if (options.validation) {
      using S = vk::DebugUtilsMessageSeverityFlagBitsEXT;
      using T = vk::DebugUtilsMessageTypeFlagBitsEXT;
      messenger_ = vk::raii::DebugUtilsMessengerEXT(
          instance_,
          vk::DebugUtilsMessengerCreateInfoEXT({}, S::eWarning | S::eError, T::eGeneral | T::eValidation | T::ePerformance, &on_validation_message));
    }
    vk::raii::PhysicalDevices devices(instance_);
    int best_rank = 1 << 30;
    for (auto& d : devices) {
      auto props = d.getProperties();
      std::string name(props.deviceName.data());
      if (!options.device_filter.empty() && name.find(options.device_filter) == std::string::npos) continue;
      bool compute = false;
      for (const auto& q : d.getQueueFamilyProperties()) compute |= static_cast<bool>(q.queueFlags & vk::QueueFlagBits::eCompute);
      if (!compute) continue;
      int rank = device_rank(props.deviceType);
      if (rank < best_rank) {
        best_rank = rank;
        physical_ = std::move(d);
      }
    }
    if (!*physical_) {
      if (!options.device_filter.empty()) throw BackendError("vulkan: no device matches QKV_VULKAN_DEVICE='" + options.device_filter + "'");
      throw BackendError("vulkan: no Vulkan device with a compute queue (for a CPU device install mesa-vulkan-drivers)");
    }
    properties_ = physical_.getProperties();
    memory_properties_ = physical_.getMemoryProperties();
    const SubgroupSupport sub = subgroup_support(physical_);
    if (sub.ballot) subgroup_size_ = sub.size;
    subgroup_arithmetic_ = sub.ballot && sub.arithmetic;
    auto families = physical_.getQueueFamilyProperties();
    for (std::uint32_t i = 0; i < families.size(); ++i)
      if (families[i].queueFlags & vk::QueueFlagBits::eCompute) {
        queue_family_ = i;
        timestamp_bits_ = families[i].timestampValidBits;
        if (timestamp_bits_) timestamp_period_ns_ = properties_.limits.timestampPeriod;
        break;
      }
    float priority = 1.0f;
    vk::DeviceQueueCreateInfo queue_info({}, queue_family_, 1, &priority);
    // Features chained into the device's creation where the device has them: 16-bit storage
    // buffers (core in Vulkan 1.1: f16 and bf16 values uploaded, held and downloaded in 16
    // bits), f16 arithmetic (VK_KHR_shader_float16_int8) and cooperative matrices
    // (VK_NV_cooperative_matrix, or VK_KHR_cooperative_matrix with the kernels translated) for
    // the matmul and attention kernels that multiply f16 values on them, with the Vulkan memory
    // model their fragment loads use.
    vk::DeviceCreateInfo device_info({}, queue_info);
    std::vector<std::string> available;
    for (const auto& e : physical_.enumerateDeviceExtensionProperties()) available.emplace_back(e.extensionName.data());
    auto has = [&](std::string_view name) { return std::find(available.begin(), available.end(), name) != available.end(); };
    std::vector<const char*> enabled;
    void* chain = nullptr;
    vk::PhysicalDevice16BitStorageFeatures storage16;
    vk::PhysicalDeviceShaderFloat16Int8Features float16;
    vk::PhysicalDeviceCooperativeMatrixFeaturesNV cooperative;
    CooperativeMatrixFeaturesKhr cooperative_khr;
    vk::PhysicalDeviceVulkanMemoryModelFeatures memory_model;
    if (properties_.apiVersion >= VK_API_VERSION_1_1)
      storage16_ = physical_.getFeatures2<vk::PhysicalDeviceFeatures2, vk::PhysicalDevice16BitStorageFeatures>()
                       .get<vk::PhysicalDevice16BitStorageFeatures>()
                       .storageBuffer16BitAccess;
    if (storage16_) {
      storage16.storageBuffer16BitAccess = VK_TRUE;
      storage16.pNext = chain;
      chain = &storage16;
    }
    if (has(VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME))
      float16_ = physical_.getFeatures2<vk::PhysicalDeviceFeatures2, vk::PhysicalDeviceShaderFloat16Int8Features>()
                     .get<vk::PhysicalDeviceShaderFloat16Int8Features>()
                     .shaderFloat16;
    if (float16_) {
      enabled.push_back(VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME);
      float16.shaderFloat16 = VK_TRUE;
      float16.pNext = chain;
      chain = &float16;
    }
    CooperativeOffer offer;
    if (float16_ && storage16_) {
      offer = offered_fragment(instance_, physical_, options.cooperative_matrix == VulkanOptions::CooperativeMatrix::khr);
      cooperative_fragment_ = offer.fragment;
      cooperative_khr_ = offer.khr;
    }
    if (cooperative_fragment_[0] != 0) {
      if (cooperative_khr_) {
        enabled.push_back(kKhrCooperativeMatrix);
        cooperative_khr.cooperativeMatrix = VK_TRUE;
        cooperative_khr.pNext = chain;
        chain = &cooperative_khr;
      } else {
        enabled.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
        cooperative.cooperativeMatrix = VK_TRUE;
        cooperative.pNext = chain;
        chain = &cooperative;
      }
    }
    // The Vulkan memory model, which the cooperative kernels' fragment loads use, with Device
    // scope, which every kernel's atomics and buffer barriers use (a device created with the
    // model but not its Device scope forbids that scope in every module). Enabled wherever the
    // device offers both, so that lavapipe runs every kernel under the model a GPU's cooperative
    // kernels need; without Device scope, not at all (no cooperative kernels then).
    if (memory_model_support(physical_).device_scope) {
      enabled.push_back(VK_KHR_VULKAN_MEMORY_MODEL_EXTENSION_NAME);
      memory_model.vulkanMemoryModel = VK_TRUE;
      memory_model.vulkanMemoryModelDeviceScope = VK_TRUE;
      memory_model.pNext = chain;
      chain = &memory_model;
    }
    device_info.pNext = chain;
    device_info.setPEnabledExtensionNames(enabled);
    device_ = vk::raii::Device(physical_, device_info);
    // What pipelines are checked against: exactly what was enabled above.
    features_.api_version = std::min<std::uint32_t>(VK_API_VERSION_1_1, properties_.apiVersion);
    features_.extensions.insert(enabled.begin(), enabled.end());
    features_.storage_buffer_16bit = storage16_;
    features_.shader_float16 = float16_;
    features_.memory_model = features_.memory_model_device_scope = memory_model.vulkanMemoryModel == VK_TRUE;
    if (sub.ballot) features_.subgroup_operations = sub.operations;
    if (cooperative_fragment_[0] != 0) features_.cooperative = offer.offers;
    const auto& limits = properties_.limits;
    features_.max_shared_memory = limits.maxComputeSharedMemorySize;
    features_.max_invocations = limits.maxComputeWorkGroupInvocations;
    features_.max_push_constants = limits.maxPushConstantsSize;
    features_.max_storage_buffers = limits.maxPerStageDescriptorStorageBuffers;  // some drivers report UINT32_MAX
    features_.max_storage_range = limits.maxStorageBufferRange;
    features_.max_workgroup_size = {limits.maxComputeWorkGroupSize[0], limits.maxComputeWorkGroupSize[1], limits.maxComputeWorkGroupSize[2]};
    queue_ = vk::raii::Queue(device_, queue_family_, 0);
    pool_ = vk::raii::CommandPool(device_, vk::CommandPoolCreateInfo(vk::CommandPoolCreateFlagBits::eResetCommandBuffer, queue_family_));
    profile_.name = device_name();
    profile_.cpu_device = properties_.deviceType == vk::PhysicalDeviceType::eCpu;
    profile_.subgroup_size = subgroup_size_;
    profile_.subgroup_arithmetic = subgroup_arithmetic_;
    profile_.cooperative_fragment = cooperative_fragment_;
    profile_.cooperative_khr = cooperative_khr_;
    profile_.storage_offset_alignment = limits.minStorageBufferOffsetAlignment;
    profile_.max_workgroup_count =
        std::min({limits.maxComputeWorkGroupCount[0], limits.maxComputeWorkGroupCount[1], limits.maxComputeWorkGroupCount[2]});
    profile_.features = features_;
  });
}

std::shared_ptr<Context> Context::get(const VulkanOptions& options) {
  // Contexts live until the process exits (never destroyed: their drivers may be unloaded by
  // then). Creating and destroying instances over and over is not only slow: NVIDIA's driver
  // (580, headless) refuses vkCreateInstance with ErrorIncompatibleDriver after a handful of
  // cycles, which the benchmarks, creating a backend per row, ran into.
  static std::mutex mutex;
  static auto* contexts = new std::map<std::tuple<std::string, bool, bool, bool>, std::shared_ptr<Context>>;
  std::lock_guard lock(mutex);
  auto& slot = (*contexts)[{options.device_filter, options.validation, options.cooperative_matrix == VulkanOptions::CooperativeMatrix::khr,
                            options.optimize_spirv}];
  if (!slot) slot = std::make_shared<Context>(options);
  return slot;
}

std::string Context::device_name() const {
  return std::string(properties_.deviceName.data()) + " (" + device_type_name(properties_.deviceType) + ", Vulkan " +
         std::to_string(VK_API_VERSION_MAJOR(properties_.apiVersion)) + "." + std::to_string(VK_API_VERSION_MINOR(properties_.apiVersion)) + ")";
}

Buffer Context::make_buffer(vk::DeviceSize size, vk::BufferUsageFlags usage, bool host_visible) const {
  return guarded("buffer allocation", [&] {
    Buffer b;
    b.size = size < 16 ? 16 : size;
    b.buffer = vk::raii::Buffer(device_, vk::BufferCreateInfo({}, b.size, usage, vk::SharingMode::eExclusive));
    auto req = b.buffer.getMemoryRequirements();
    using M = vk::MemoryPropertyFlagBits;
    vk::MemoryPropertyFlags need = host_visible ? (M::eHostVisible | M::eHostCoherent) : vk::MemoryPropertyFlags{};
    vk::MemoryPropertyFlags want = host_visible ? need | M::eHostCached : M::eDeviceLocal;
    std::uint32_t type = UINT32_MAX;
    for (auto flags : {want, need}) {
      for (std::uint32_t i = 0; i < memory_properties_.memoryTypeCount && type == UINT32_MAX; ++i)
        if ((req.memoryTypeBits & (1u << i)) && (memory_properties_.memoryTypes[i].propertyFlags & flags) == flags) type = i;
      if (type != UINT32_MAX) break;
    }
    if (type == UINT32_MAX) throw BackendError("vulkan: no memory type for a buffer of " + std::to_string(size) + " bytes");
    b.memory = vk::raii::DeviceMemory(device_, vk::MemoryAllocateInfo(req.size, type));
    b.buffer.bindMemory(*b.memory, 0);
    if (host_visible) b.mapped = b.memory.mapMemory(0, VK_WHOLE_SIZE);
    return b;
  });
}

void Context::submit_and_wait(const std::function<void(const vk::raii::CommandBuffer&)>& record) const {
  guarded("transfer", [&] {
    vk::raii::CommandBuffers cbs(device_, vk::CommandBufferAllocateInfo(*pool_, vk::CommandBufferLevel::ePrimary, 1));
    const vk::raii::CommandBuffer& cb = cbs[0];
    cb.begin(vk::CommandBufferBeginInfo(vk::CommandBufferUsageFlagBits::eOneTimeSubmit));
    record(cb);
    cb.end();
    vk::raii::Fence fence(device_, vk::FenceCreateInfo());
    vk::CommandBuffer handle = *cb;
    queue_.submit(vk::SubmitInfo({}, {}, handle), *fence);
    if (device_.waitForFences(*fence, VK_TRUE, UINT64_MAX) != vk::Result::eSuccess) throw BackendError("vulkan: waiting for a transfer failed");
  });
}

std::vector<std::pair<std::string, codegen::SpirvNeeds>> Context::kernel_needs() const {
  std::lock_guard lock(mutex_);
  std::vector<std::pair<std::string, codegen::SpirvNeeds>> all;
  for (const auto& [key, p] : pipelines_) all.emplace_back(p->kernel, p->needs);
  return all;
}

const Pipeline& Context::pipeline(const codegen::KernelSource& k, const std::vector<std::uint32_t>& specialization) {
  std::string key = k.name + "#" + std::to_string(codegen::content_hash(k.glsl));
  for (std::uint32_t c : specialization) key += "/" + std::to_string(c);
  std::lock_guard lock(mutex_);
  if (auto it = pipelines_.find(key); it != pipelines_.end()) return *it->second;
  codegen::SpirvNeeds needs;
  const std::vector<std::uint32_t> spirv = device_spirv(k, profile_, optimization_, specialization, &needs);
  return guarded("pipeline creation", [&]() -> const Pipeline& {
    auto p = std::make_unique<Pipeline>();
    p->kernel = k.name;
    p->needs = std::move(needs);
    p->buffers = k.buffers;
    std::vector<vk::DescriptorSetLayoutBinding> bindings;
    for (int i = 0; i < k.buffers; ++i)
      bindings.emplace_back(static_cast<std::uint32_t>(i), vk::DescriptorType::eStorageBuffer, 1, vk::ShaderStageFlagBits::eCompute);
    p->set_layout = vk::raii::DescriptorSetLayout(device_, vk::DescriptorSetLayoutCreateInfo({}, bindings));
    vk::PushConstantRange push(vk::ShaderStageFlagBits::eCompute, 0, codegen::kMaxPushWords * 4);
    vk::DescriptorSetLayout set_layout = *p->set_layout;
    p->layout = vk::raii::PipelineLayout(device_, vk::PipelineLayoutCreateInfo({}, set_layout, push));
    vk::raii::ShaderModule module(device_, vk::ShaderModuleCreateInfo({}, spirv));
    std::vector<vk::SpecializationMapEntry> entries;
    for (std::uint32_t i = 0; i < specialization.size(); ++i) entries.emplace_back(i, i * 4, 4);
    vk::SpecializationInfo constants(static_cast<std::uint32_t>(entries.size()), entries.data(), specialization.size() * 4, specialization.data());
    vk::PipelineShaderStageCreateInfo stage({}, vk::ShaderStageFlagBits::eCompute, *module, "main", specialization.empty() ? nullptr : &constants);
    p->pipeline = vk::raii::Pipeline(device_, nullptr, vk::ComputePipelineCreateInfo({}, stage, *p->layout));
    return *(pipelines_[key] = std::move(p));
  });
}

}  // namespace vulkan
}  // namespace qkv::backend
