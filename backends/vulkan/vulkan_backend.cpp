// The Vulkan backend's executable: one arena buffer planned per input shapes, one descriptor set
// per kernel, and one command buffer recorded once and submitted on every run.
#include "backends/vulkan/vulkan_backend.hpp"

#include <cstring>

#include "backends/shape_cache.hpp"
#include "backends/vulkan/context.hpp"
#include "codegen/glsl.hpp"
#include "ir/passes/memory_plan.hpp"
#include "ir/passes/passes.hpp"

namespace qkv::backend {

namespace {

using ir::Node;
using ir::Op;
using vk_detail::Buffer;
using vk_detail::Context;
using vk_detail::guarded;

/// Host <-> staging conversion: device buffers hold every value, booleans too, as float.
void write_staging(const Tensor& t, void* dst) {
  if (t.dtype() == DType::f32) {
    if (t.nbytes()) std::memcpy(dst, t.raw(), t.nbytes());
    return;
  }
  auto* f = static_cast<float*>(dst);
  for (std::int64_t i = 0; i < t.numel(); ++i) f[i] = static_cast<float>(t.at(i));
}

class VulkanExecutable final : public Executable {
 public:
  VulkanExecutable(std::shared_ptr<Context> ctx, ir::Graph g) : ctx_(std::move(ctx)), graph_(std::move(g)) {
    for (std::size_t i = 0; i < graph_.size(); ++i) {
      const Node& n = graph_.nodes()[i];
      if (!codegen::has_kernel(n)) continue;
      auto v = static_cast<ir::ValueId>(i);
      kernels_.push_back({v, &ctx_->pipeline(codegen::kernel_source(graph_, v))});
    }
  }
  const ir::Graph& graph() const override { return graph_; }
  std::int64_t planned_bytes() const override { return memory_.total_bytes; }

  TensorMap run(const TensorMap& inputs) override {
    return guarded("run", [&] {
      if (!signature_.matches(graph_, inputs)) plan(inputs);
      for (const auto& [v, offset] : input_staging_)
        write_staging(inputs.find(graph_.node(v).name)->second, static_cast<std::byte*>(staging_in_.mapped) + offset);
      ctx_->device().resetFences(*fence_);
      vk::CommandBuffer cb = *command_buffer_;
      ctx_->queue().submit(vk::SubmitInfo({}, {}, cb), *fence_);
      if (ctx_->device().waitForFences(*fence_, VK_TRUE, UINT64_MAX) != vk::Result::eSuccess)
        throw BackendError("vulkan: waiting for the run failed");
      TensorMap out;
      for (const auto& [name, v] : graph_.outputs()) {
        const auto* src = reinterpret_cast<const float*>(static_cast<const std::byte*>(staging_out_.mapped) + output_staging_.at(name));
        Tensor t(graph_.node(v).dtype, ir::to_vector(shapes_[static_cast<std::size_t>(v)]));
        if (t.dtype() == DType::boolean) {
          for (std::int64_t j = 0; j < t.numel(); ++j) t.data<std::uint8_t>()[j] = src[j] != 0.0f;
        } else {
          if (t.nbytes()) std::memcpy(t.raw(), src, t.nbytes());
        }
        out.emplace(name, std::move(t));
      }
      return out;
    });
  }

 private:
  void plan(const TensorMap& inputs) {
    shapes_ = ir::bind_shapes(graph_, inputs);
    const auto& dev = ctx_->device();
    dev.waitIdle();
    // Release what the previous plan recorded, users before what they use.
    command_buffer_ = nullptr;
    descriptor_sets_.clear();
    descriptor_pool_ = nullptr;
    std::vector<std::int64_t> bytes(graph_.size());
    for (std::size_t i = 0; i < graph_.size(); ++i) bytes[i] = shapes_[i].numel() * 4;
    auto align = static_cast<std::int64_t>(std::max<vk::DeviceSize>(ctx_->properties().limits.minStorageBufferOffsetAlignment, 16));
    memory_ = ir::plan_memory(graph_, bytes, [](const Node&) { return false; }, align);

    using U = vk::BufferUsageFlagBits;
    arena_ = ctx_->make_buffer(static_cast<vk::DeviceSize>(memory_.total_bytes), U::eStorageBuffer | U::eTransferSrc | U::eTransferDst, false);
    std::vector<vk::BufferCopy> uploads, downloads;
    input_staging_.clear();
    output_staging_.clear();
    std::int64_t in_bytes = 0, out_bytes = 0;
    for (ir::ValueId v : graph_.inputs()) {
      auto vi = static_cast<std::size_t>(v);
      input_staging_.emplace_back(v, in_bytes);
      if (bytes[vi]) uploads.emplace_back(in_bytes, memory_.offset[vi], bytes[vi]);
      in_bytes += (bytes[vi] + 15) / 16 * 16;
    }
    for (const auto& [name, v] : graph_.outputs()) {
      auto root = static_cast<std::size_t>(memory_.storage_of[static_cast<std::size_t>(v)]);
      output_staging_[name] = out_bytes;
      if (bytes[static_cast<std::size_t>(v)]) downloads.emplace_back(memory_.offset[root], out_bytes, bytes[static_cast<std::size_t>(v)]);
      out_bytes += (bytes[static_cast<std::size_t>(v)] + 15) / 16 * 16;
    }
    staging_in_ = ctx_->make_buffer(static_cast<vk::DeviceSize>(in_bytes), U::eTransferSrc, true);
    staging_out_ = ctx_->make_buffer(static_cast<vk::DeviceSize>(out_bytes), U::eTransferDst, true);

    // One descriptor set per kernel, binding its operands' and result's ranges of the arena.
    std::uint32_t descriptors = 0;
    for (const auto& k : kernels_) descriptors += static_cast<std::uint32_t>(k.pipeline->buffers);
    vk::DescriptorPoolSize pool_size(vk::DescriptorType::eStorageBuffer, std::max(descriptors, 1u));
    descriptor_pool_ = vk::raii::DescriptorPool(
        dev, vk::DescriptorPoolCreateInfo(vk::DescriptorPoolCreateFlagBits::eFreeDescriptorSet,
                                          std::max<std::uint32_t>(static_cast<std::uint32_t>(kernels_.size()), 1), pool_size));
    std::vector<vk::DescriptorSetLayout> layouts;
    for (const auto& k : kernels_) layouts.push_back(*k.pipeline->set_layout);
    if (!layouts.empty()) descriptor_sets_ = vk::raii::DescriptorSets(dev, vk::DescriptorSetAllocateInfo(*descriptor_pool_, layouts));
    auto range = [&](ir::ValueId v) {
      auto root = static_cast<std::size_t>(memory_.storage_of[static_cast<std::size_t>(v)]);
      return vk::DescriptorBufferInfo(*arena_.buffer, static_cast<vk::DeviceSize>(memory_.offset[root]),
                                      static_cast<vk::DeviceSize>(std::max<std::int64_t>(bytes[static_cast<std::size_t>(v)], 4)));
    };
    for (std::size_t k = 0; k < kernels_.size(); ++k) {
      const Node& n = graph_.node(kernels_[k].value);
      std::vector<vk::DescriptorBufferInfo> infos;
      for (ir::ValueId in : n.inputs) infos.push_back(range(in));
      infos.push_back(range(kernels_[k].value));
      std::vector<vk::WriteDescriptorSet> writes;
      for (std::size_t b = 0; b < infos.size(); ++b)
        writes.emplace_back(*descriptor_sets_[k], static_cast<std::uint32_t>(b), 0, 1, vk::DescriptorType::eStorageBuffer, nullptr, &infos[b]);
      dev.updateDescriptorSets(writes, {});
    }
    record(uploads, downloads);
    signature_.record(graph_, inputs);
  }

  void record(const std::vector<vk::BufferCopy>& uploads, const std::vector<vk::BufferCopy>& downloads) {
    const auto& dev = ctx_->device();
    if (!*fence_) fence_ = vk::raii::Fence(dev, vk::FenceCreateInfo());
    command_buffer_ = std::move(vk::raii::CommandBuffers(dev, vk::CommandBufferAllocateInfo(*ctx_->command_pool(), vk::CommandBufferLevel::ePrimary, 1))[0]);
    auto& cb = command_buffer_;
    cb.begin(vk::CommandBufferBeginInfo());
    using A = vk::AccessFlagBits;
    using S = vk::PipelineStageFlagBits;
    auto barrier = [&](vk::AccessFlags src, vk::AccessFlags dst, vk::PipelineStageFlags from, vk::PipelineStageFlags to) {
      cb.pipelineBarrier(from, to, {}, vk::MemoryBarrier(src, dst), {}, {});
    };
    if (!uploads.empty()) cb.copyBuffer(*staging_in_.buffer, *arena_.buffer, uploads);
    barrier(A::eTransferWrite, A::eShaderRead | A::eShaderWrite, S::eTransfer, S::eComputeShader);
    for (std::size_t k = 0; k < kernels_.size(); ++k) {
      const auto& kernel = kernels_[k];
      auto launch = codegen::kernel_launch(graph_, kernel.value, shapes_);
      cb.bindPipeline(vk::PipelineBindPoint::eCompute, *kernel.pipeline->pipeline);
      cb.bindDescriptorSets(vk::PipelineBindPoint::eCompute, *kernel.pipeline->layout, 0, *descriptor_sets_[k], {});
      cb.pushConstants<std::uint32_t>(*kernel.pipeline->layout, vk::ShaderStageFlagBits::eCompute, 0, launch.push);
      cb.dispatch(launch.groups[0], launch.groups[1], launch.groups[2]);
      barrier(A::eShaderWrite, A::eShaderRead | A::eShaderWrite | A::eTransferRead, S::eComputeShader, S::eComputeShader | S::eTransfer);
    }
    if (!downloads.empty()) cb.copyBuffer(*arena_.buffer, *staging_out_.buffer, downloads);
    barrier(A::eTransferWrite, A::eHostRead, S::eTransfer, S::eHost);
    cb.end();
  }

  struct Kernel {
    ir::ValueId value;
    const vk_detail::Pipeline* pipeline;
  };

  std::shared_ptr<Context> ctx_;
  ir::Graph graph_;
  std::vector<Kernel> kernels_;
  InputSignature signature_;
  std::vector<ir::Shape> shapes_;
  ir::MemoryPlan memory_;
  Buffer arena_, staging_in_, staging_out_;
  std::vector<std::pair<ir::ValueId, std::int64_t>> input_staging_;
  std::map<std::string, std::int64_t, std::less<>> output_staging_;
  vk::raii::DescriptorPool descriptor_pool_{nullptr};
  vk::raii::DescriptorSets descriptor_sets_{nullptr};
  vk::raii::Fence fence_{nullptr};
  vk::raii::CommandBuffer command_buffer_{nullptr};
};

class VulkanBackend final : public Backend {
 public:
  explicit VulkanBackend(const VulkanOptions& o) : ctx_(Context::get(o)) {}
  std::string name() const override { return "vulkan"; }
  std::string device() const override { return ctx_->device_name(); }
  bool supports(const Node& n) const override { return codegen::implements(n); }
  std::unique_ptr<Executable> compile(const ir::Graph& g) override {
    ir::Graph lowered = ir::lower_for_backend(g, [this](const Node& n) { return supports(n); });
    for (const Node& n : lowered.nodes())
      if (auto why = codegen::unsupported_reason(lowered, n)) throw UnsupportedError("vulkan: " + *why);
    return std::make_unique<VulkanExecutable>(ctx_, std::move(lowered));
  }

 private:
  std::shared_ptr<Context> ctx_;
};

}  // namespace

std::unique_ptr<Backend> make_vulkan_backend(const VulkanOptions& options) { return std::make_unique<VulkanBackend>(options); }

std::vector<std::string> vulkan_devices() {
  return guarded("device listing", [] {
    vk::raii::Context context;
    vk::ApplicationInfo app("qkv", 1, "qkv", 1, VK_API_VERSION_1_1);
    vk::raii::Instance instance(context, vk::InstanceCreateInfo({}, &app));
    std::vector<std::string> r;
    for (auto& d : vk::raii::PhysicalDevices(instance)) r.push_back(std::string(d.getProperties().deviceName.data()));
    return r;
  });
}

}  // namespace qkv::backend
