// The Vulkan backend's executable: one arena buffer planned per input shapes, one descriptor set
// per kernel, and one command buffer recorded once and submitted on every run.
#include "backends/vulkan/vulkan_backend.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

#include "backends/executable_skeleton.hpp"
#include "backends/half_precision.hpp"
#include "backends/vulkan/barriers.hpp"
#include "backends/vulkan/context.hpp"
#include "codegen/fusion.hpp"
#include "codegen/glsl.hpp"
#include "codegen/push_constants.hpp"
#include "codegen/storage_plan.hpp"
#include "ir/passes/memory_plan.hpp"
#include "ir/passes/passes.hpp"

namespace qkv::backend {

namespace {

using ir::Node;
using ir::Op;
using vulkan::Buffer;
using vulkan::Context;
using vulkan::guarded;

/// Host <-> staging conversion: device buffers hold every value, booleans too, as float.
void write_staging(const Tensor& t, void* dst) {
  if (t.dtype() == DType::f32 || is_half(t.dtype())) {  // as the arena holds it
    if (t.nbytes()) std::memcpy(dst, t.raw(), t.nbytes());
    return;
  }
  auto* f = static_cast<float*>(dst);
  for (std::int64_t i = 0; i < t.numel(); ++i) f[i] = static_cast<float>(t.at(i));
}

class VulkanExecutable final : public ExecutableSkeleton {
 public:
  /// Fuses elementwise chains within `fusion`'s limits, or gives every node its own kernel.
  VulkanExecutable(std::shared_ptr<Context> ctx, ir::Graph g, codegen::Target target, std::optional<codegen::FusionLimits> fusion)
      : ExecutableSkeleton(std::move(g)), ctx_(std::move(ctx)), target_(target),
        storage_(codegen::plan_storage(graph_, target_.view_alignment, target_.storage_buffers)) {
    const std::uint32_t most = ctx_->properties().limits.maxPerStageDescriptorStorageBuffers;
    std::vector<codegen::KernelGroup> groups = fusion ? codegen::plan_kernels(graph_, storage_, *fusion) : codegen::unfused_kernels(graph_, storage_);
    for (auto& group : groups) {
      const ir::ValueId v = group.root;
      const Node& n = graph_.node(v);
      codegen::KernelSource source =
          group.fused() ? codegen::fused_source(graph_, storage_, group, target_) : codegen::kernel_source(graph_, storage_, v, target_);
      Kernel k{v, std::move(source), nullptr, -1, std::move(group)};
      // (A flash kernel reading paged keys or values binds their block tables too; a tangent's
      // binds the forward's output only where it writes it: codegen::forward_beside.)
      const int tables = static_cast<int>(k.group.operands.size()) - static_cast<int>(n.inputs.size());
      const int unbound = ir::attention_roles(n.op).jvp() && k.group.beside < 0 ? 1 : 0;
      QKV_ASSERT(k.group.fused() || k.source.buffers + unbound == codegen::storage_buffers(n) + tables,
                 "codegen::storage_buffers disagrees with " + k.source.name);
      if (static_cast<std::uint32_t>(k.source.buffers) > most)  // supports() decomposes what can be
        throw UnsupportedError("vulkan: %" + std::to_string(v) + " " + std::string(ir::op_name(n.op)) + " (kernel " + k.source.name + ") binds " +
                               std::to_string(k.source.buffers) + " storage buffers; this device allows " + std::to_string(most) + " per shader");
      if (k.source.counts_tiles) k.counter = counters_++;
      // Compiled now, so that a shader error surfaces at compile(); specialized kernels get their
      // pipelines once the shapes are bound.
      if (!codegen::specialized(graph_, k.group)) k.pipeline = &ctx_->pipeline(k.source);
      kernels_.push_back(std::move(k));
    }
  }
  std::int64_t planned_bytes() const override { return memory_.total_bytes; }
  std::vector<TileCount> tile_counts() const override { return tile_counts_; }
  void set_profiling(bool on) override {
    if (on == profiling_) return;
    profiling_ = on;
    last_profile_.clear();
    signature_.invalidate();  // the next run records its command buffer with (or without) timestamps
  }
  std::vector<KernelTime> profile() const override { return last_profile_; }

  void set_state(TensorMap tensors) override {
    check_state_names(graph_, tensors);
    state_ = std::move(tensors);
    device_newer_ = false;
    signature_.invalidate();  // the next run plans again and uploads the new state once
  }

  TensorMap state() override {
    if (device_newer_) guarded("state download", [&] { download_state(); });
    return state_;
  }

  TensorMap run(const TensorMap& inputs) override {
    return guarded("run", [&] { return ExecutableSkeleton::run(inputs); });
  }
  void run_into(const TensorMap& inputs, TensorMap& outputs) override {
    guarded("run", [&] { ExecutableSkeleton::run_into(inputs, outputs); });
  }
  /// One submission: every output is reported when it ends.
  TensorMap run_observed(const TensorMap& inputs, RunObserver& observer) override {
    return guarded("run", [&] { return ExecutableSkeleton::run_observed(inputs, observer); });
  }

 protected:
  void compute() override {
    for (std::size_t i = 0; i < input_ids_.size(); ++i)
      if (staging_offset_[i] >= 0) write_staging(*tensors_[i], static_cast<std::byte*>(staging_in_.mapped) + staging_offset_[i]);
    ctx_->device().resetFences(*fence_);
    vk::CommandBuffer cb = *command_buffer_;
    ctx_->queue().submit(vk::SubmitInfo({}, {}, cb), *fence_);
    if (ctx_->device().waitForFences(*fence_, VK_TRUE, UINT64_MAX) != vk::Result::eSuccess) throw BackendError("vulkan: waiting for the run failed");
    if (!graph_.updates().empty()) device_newer_ = true;
    if (*query_pool_) read_timestamps();
    read_tile_counts();
  }
  Tensor output(std::string_view name, ir::ValueId v) override {
    return held_output(v, static_cast<const std::byte*>(staging_out_.mapped) + output_staging_.find(name)->second, storage_.held(v));
  }
  void output_into(std::string_view name, ir::ValueId v, Tensor& dst) override {
    held_output_into(v, static_cast<const std::byte*>(staging_out_.mapped) + output_staging_.find(name)->second, storage_.held(v), dst);
  }

 private:
  /// Bytes of v's value in the arena: 2 per element for an f16 or bf16 value (a kept input, a
  /// cast to a half type, a half view of an input), 4 for the rest (bool and i32 as floats).
  std::int64_t bytes_of(ir::ValueId v) const {
    if (storage_[v].kind == ir::StorageKind::paged) return 0;  // the flash kernels read its pages
    return shapes_[static_cast<std::size_t>(v)].numel() * static_cast<std::int64_t>(dtype_size(storage_.held(v)));
  }
  std::int64_t offset_of(ir::ValueId v) const {
    const auto i = static_cast<std::size_t>(v);
    return memory_.offset[static_cast<std::size_t>(memory_.storage_of[i])] + memory_.view_offset[i];
  }
  bool held(ir::ValueId input) const { return state_.contains(graph_.node(input).name); }

  /// The flash kernels' counts of the scores they computed, as the last run left them.
  void read_tile_counts() {
    tile_counts_.clear();
    for (std::size_t k = 0; k < kernels_.size(); ++k) {
      if (kernels_[k].counter < 0) continue;
      const auto* words = reinterpret_cast<const std::uint32_t*>(static_cast<const std::byte*>(counts_.mapped) + counter_offset(kernels_[k].counter));
      const auto computed = static_cast<std::int64_t>(words[0] | static_cast<std::uint64_t>(words[1]) << 32);
      tile_counts_.push_back({kernels_[k].value, computed, launches_[k].scores - computed, 0});
    }
  }
  /// Where counter c lies in counts_: storage-buffer offsets keep the device's alignment.
  vk::DeviceSize counter_offset(int c) const {
    return static_cast<vk::DeviceSize>(c) * std::max<vk::DeviceSize>(ctx_->properties().limits.minStorageBufferOffsetAlignment, 16);
  }

  /// Turns the timestamps written around each kernel into the last run's profile.
  void read_timestamps() {
    const auto count = static_cast<std::uint32_t>(kernels_.size() + 1);
    std::vector<std::uint64_t> ticks(count);
    const auto result = (*ctx_->device())
                            .getQueryPoolResults(*query_pool_, 0, count, ticks.size() * sizeof(std::uint64_t), ticks.data(), sizeof(std::uint64_t),
                                                 vk::QueryResultFlagBits::e64 | vk::QueryResultFlagBits::eWait);
    if (result != vk::Result::eSuccess) throw BackendError("vulkan: reading the kernel timestamps failed");
    last_profile_.clear();
    const double period = ctx_->timestamp_period_ns() * 1e-9;
    for (std::size_t k = 0; k < kernels_.size(); ++k)
      last_profile_.push_back({kernels_[k].value, static_cast<double>(ctx_->ticks_between(ticks[k], ticks[k + 1])) * period});
  }

  void plan() override {
    const auto& dev = ctx_->device();
    dev.waitIdle();
    if (device_newer_) download_state();  // the arena is about to be replaced
    // Release what the previous plan recorded, users before what they use.
    command_buffer_ = nullptr;
    query_pool_ = nullptr;
    descriptor_sets_.clear();
    descriptor_pool_ = nullptr;
    bind_shapes();
    std::vector<std::int64_t> bytes(graph_.size());
    for (std::size_t i = 0; i < graph_.size(); ++i) bytes[i] = bytes_of(static_cast<ir::ValueId>(i));
    // A fused kernel's node reads the kernel's operands; the nodes computed inside it get no storage.
    std::vector<std::vector<ir::ValueId>> reads(graph_.size());
    for (std::size_t i = 0; i < graph_.size(); ++i) reads[i] = graph_.nodes()[i].inputs;
    std::set<const Node*> no_storage;
    for (const auto& k : kernels_) {
      reads[static_cast<std::size_t>(k.value)] = k.group.operands;
      for (ir::ValueId m : k.group.inlined) {
        reads[static_cast<std::size_t>(m)].clear();
        no_storage.insert(&graph_.node(m));
      }
    }
    // The storage plan's views read their operands' storage in place, and its placed, narrowed
    // and concat values are written by their operands' kernels (codegen::plan_storage).
    const std::vector<std::int64_t> views = storage_.memory_views();
    const std::vector<ir::Placement> placed = storage_.memory_placements();
    memory_ = ir::plan_memory(
        graph_, bytes, [&](const Node& n) { return no_storage.contains(&n); }, storage_.view_alignment, &reads, &views, &placed);
    check_binding_ranges();

    using U = vk::BufferUsageFlagBits;
    arena_ = ctx_->make_buffer(static_cast<vk::DeviceSize>(memory_.total_bytes), U::eStorageBuffer | U::eTransferSrc | U::eTransferDst, false);
    // Per-run uploads: the inputs not held as state. Per-run downloads: the outputs.
    std::vector<vk::BufferCopy> uploads, downloads;
    staging_offset_.assign(input_ids_.size(), -1);
    output_staging_.clear();
    std::int64_t in_bytes = 0, out_bytes = 0;
    for (std::size_t i = 0; i < input_ids_.size(); ++i) {
      ir::ValueId v = input_ids_[i];
      if (held(v)) continue;
      staging_offset_[i] = in_bytes;
      if (bytes_of(v)) uploads.emplace_back(in_bytes, offset_of(v), bytes_of(v));
      in_bytes += (bytes_of(v) + 15) / 16 * 16;
    }
    for (const auto& [name, v] : graph_.outputs()) {
      output_staging_[name] = out_bytes;
      if (bytes_of(v)) downloads.emplace_back(offset_of(v), out_bytes, bytes_of(v));
      out_bytes += (bytes_of(v) + 15) / 16 * 16;
    }
    staging_in_ = ctx_->make_buffer(static_cast<vk::DeviceSize>(in_bytes), U::eTransferSrc, true);
    staging_out_ = ctx_->make_buffer(static_cast<vk::DeviceSize>(out_bytes), U::eTransferDst, true);
    counts_ = ctx_->make_buffer(counter_offset(std::max(counters_, 1)), U::eStorageBuffer | U::eTransferDst, true);

    plan_launches();
    plan_split_buffer();
    write_descriptor_sets();
    // Updates: each updated input's region takes its new value at the end of every run.
    std::vector<vk::BufferCopy> updates;
    for (const auto& [name, v] : graph_.updates()) {
      ir::ValueId target = -1;
      for (ir::ValueId in : input_ids_)
        if (graph_.node(in).name == name) target = in;
      if (offset_of(v) != offset_of(target) && bytes_of(v)) updates.emplace_back(offset_of(v), offset_of(target), bytes_of(v));
    }
    if (profiling_ && ctx_->timestamp_period_ns() > 0)
      query_pool_ = vk::raii::QueryPool(dev, vk::QueryPoolCreateInfo({}, vk::QueryType::eTimestamp, static_cast<std::uint32_t>(kernels_.size() + 1)));
    record(uploads, downloads, updates);
    upload_state();
  }

  /// Launch parameters per kernel for these shapes, and the pipelines specialized for them.
  void plan_launches() {
    launches_.clear();
    for (auto& k : kernels_) {
      launches_.push_back(k.group.fused() ? codegen::fused_launch(graph_, storage_, k.group, shapes_, target_)
                                          : codegen::kernel_launch(graph_, storage_, k.value, shapes_, target_));
      codegen::check_push(k.source, launches_.back());
      for (std::uint32_t groups : launches_.back().groups)
        if (groups > ctx_->profile().max_workgroup_count)
          throw UnsupportedError("vulkan: kernel " + k.source.name + " needs " + std::to_string(groups) + " workgroups along an axis; " +
                                 ctx_->device_name() + " dispatches at most " + std::to_string(ctx_->profile().max_workgroup_count));
      if (codegen::specialized(graph_, k.group)) k.pipeline = &ctx_->pipeline(k.source, launches_.back().specialization);
    }
  }

  /// One descriptor set per kernel, binding its operands' and result's ranges of the arena.
  void write_descriptor_sets() {
    const auto& dev = ctx_->device();
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
      return vk::DescriptorBufferInfo(*arena_.buffer, static_cast<vk::DeviceSize>(offset_of(v)),
                                      static_cast<vk::DeviceSize>(std::max<std::int64_t>(bytes_of(v), 4)));
    };
    for (std::size_t k = 0; k < kernels_.size(); ++k) {
      std::vector<vk::DescriptorBufferInfo> infos;
      for (ir::ValueId in : kernels_[k].group.operands) infos.push_back(range(in));
      infos.push_back(range(kernels_[k].value));
      if (kernels_[k].group.beside >= 0) infos.push_back(range(kernels_[k].group.beside));
      if (kernels_[k].counter >= 0) infos.emplace_back(*counts_.buffer, counter_offset(kernels_[k].counter), 8);
      if (kernels_[k].source.splits_keys)
        infos.emplace_back(*split_.buffer, static_cast<vk::DeviceSize>(kernels_[k].split_offset),
                           static_cast<vk::DeviceSize>(kernels_[k].split_bytes));
      std::vector<vk::WriteDescriptorSet> writes;
      for (std::size_t b = 0; b < infos.size(); ++b)
        writes.emplace_back(*descriptor_sets_[k], static_cast<std::uint32_t>(b), 0, 1, vk::DescriptorType::eStorageBuffer, nullptr, &infos[b]);
      dev.updateDescriptorSets(writes, {});
    }
  }

  /// The split buffer: each kernel that splits keys its own aligned range of it (a kernel that
  /// does not split for these shapes binds the first 16 bytes, which it never touches).
  void plan_split_buffer() {
    const auto align = std::max<std::int64_t>(static_cast<std::int64_t>(ctx_->properties().limits.minStorageBufferOffsetAlignment), 16);
    std::int64_t split_bytes = 16;
    for (std::size_t k = 0; k < kernels_.size(); ++k) {
      Kernel& kernel = kernels_[k];
      kernel.split_offset = 0;
      kernel.split_bytes = 16;
      if (launches_[k].split_words == 0) continue;
      kernel.split_offset = (split_bytes + align - 1) / align * align;
      kernel.split_bytes = launches_[k].split_words * 4;
      if (const std::uint64_t limit = ctx_->features().max_storage_range; limit != 0 && static_cast<std::uint64_t>(kernel.split_bytes) > limit)
        throw ResourceError("vulkan: kernel " + kernel.source.name + " splits its keys into parts whose rows take " +
                            std::to_string(kernel.split_bytes) + " bytes, more than one storage buffer binding may span on " + ctx_->device_name() +
                            " (maxStorageBufferRange " + std::to_string(limit) + ")");
      split_bytes = kernel.split_offset + kernel.split_bytes;
    }
    using U = vk::BufferUsageFlagBits;
    split_ = ctx_->make_buffer(static_cast<vk::DeviceSize>(split_bytes), U::eStorageBuffer | U::eTransferDst, false);
  }

  /// Each kernel binds its operands and its result whole, one storage-buffer range apiece: a
  /// value larger than the device's maxStorageBufferRange is a ResourceError naming it, before
  /// anything is allocated (a validation error, or a wrong result, otherwise).
  void check_binding_ranges() const {
    const std::uint64_t limit = ctx_->features().max_storage_range;
    for (const auto& k : kernels_) {
      std::vector<ir::ValueId> bound = k.group.operands;
      bound.push_back(k.value);
      if (k.group.beside >= 0) bound.push_back(k.group.beside);
      for (ir::ValueId v : bound) {
        const auto b = static_cast<std::uint64_t>(bytes_of(v));
        if (limit == 0 || b <= limit) continue;
        const Node& n = graph_.node(v);
        const std::string what = n.op == Op::input ? "input '" + n.name + "'" : "%" + std::to_string(v) + " " + std::string(ir::op_name(n.op));
        throw ResourceError("vulkan: " + what + " " + graph_.type_string(n.dtype, shapes_[static_cast<std::size_t>(v)]) + " is " + std::to_string(b) +
                            " bytes, more than one storage buffer binding may span on " + ctx_->device_name() + " (maxStorageBufferRange " +
                            std::to_string(limit) + "); a kernel binds each of its tensors whole");
      }
    }
  }

  /// The arena ranges each kernel reads (its operands) and writes (its value, and for the flash
  /// kernels their tile counter, in a buffer of its own and so kept apart here).
  std::vector<KernelAccess> accesses() const {
    std::vector<KernelAccess> out;
    auto range = [&](ir::ValueId v) { return ByteRange{offset_of(v), offset_of(v) + bytes_of(v)}; };
    for (const auto& k : kernels_) {
      KernelAccess a;
      for (ir::ValueId in : k.group.operands) a.reads.push_back(range(in));
      a.writes.push_back(range(k.value));
      if (k.group.beside >= 0) a.writes.push_back(range(k.group.beside));
      out.push_back(std::move(a));
    }
    return out;
  }

  /// Copies the held tensors into their arena regions (once per plan or set_state).
  void upload_state() {
    if (state_.empty()) return;
    std::int64_t total = 0;
    for (const auto& [name, t] : state_) total += (static_cast<std::int64_t>(t.numel()) * 4 + 15) / 16 * 16;  // enough for any dtype held
    Buffer staging = ctx_->make_buffer(static_cast<vk::DeviceSize>(total), vk::BufferUsageFlagBits::eTransferSrc, true);
    std::vector<vk::BufferCopy> copies;
    std::int64_t at = 0;
    for (ir::ValueId v : input_ids_) {
      auto it = state_.find(graph_.node(v).name);
      if (it == state_.end()) continue;
      write_staging(it->second, static_cast<std::byte*>(staging.mapped) + at);
      if (bytes_of(v)) copies.emplace_back(at, offset_of(v), bytes_of(v));
      at += (bytes_of(v) + 15) / 16 * 16;
    }
    ctx_->submit_and_wait([&](const vk::raii::CommandBuffer& cb) {
      if (!copies.empty()) cb.copyBuffer(*staging.buffer, *arena_.buffer, copies);
      cb.pipelineBarrier(vk::PipelineStageFlagBits::eTransfer, vk::PipelineStageFlagBits::eComputeShader | vk::PipelineStageFlagBits::eTransfer, {},
                         vk::MemoryBarrier(vk::AccessFlagBits::eTransferWrite, vk::AccessFlagBits::eShaderRead | vk::AccessFlagBits::eTransferRead),
                         {}, {});
    });
    device_newer_ = false;
  }

  /// Copies the held inputs' current values from the arena back to the host.
  void download_state() {
    std::int64_t total = 0;
    for (const auto& [name, t] : state_) total += (static_cast<std::int64_t>(t.numel()) * 4 + 15) / 16 * 16;  // enough for any dtype held
    Buffer staging = ctx_->make_buffer(static_cast<vk::DeviceSize>(total), vk::BufferUsageFlagBits::eTransferDst, true);
    std::vector<std::pair<ir::ValueId, std::int64_t>> where;
    std::vector<vk::BufferCopy> copies;
    std::int64_t at = 0;
    for (ir::ValueId v : input_ids_) {
      if (!held(v)) continue;
      where.emplace_back(v, at);
      if (bytes_of(v)) copies.emplace_back(offset_of(v), at, bytes_of(v));
      at += (bytes_of(v) + 15) / 16 * 16;
    }
    ctx_->submit_and_wait([&](const vk::raii::CommandBuffer& cb) {
      if (!copies.empty()) cb.copyBuffer(*arena_.buffer, *staging.buffer, copies);
      cb.pipelineBarrier(vk::PipelineStageFlagBits::eTransfer, vk::PipelineStageFlagBits::eHost, {},
                         vk::MemoryBarrier(vk::AccessFlagBits::eTransferWrite, vk::AccessFlagBits::eHostRead), {}, {});
    });
    for (const auto& [v, offset] : where) {
      Tensor& t = state_.at(graph_.node(v).name);
      if (t.nbytes()) std::memcpy(t.raw(), static_cast<const std::byte*>(staging.mapped) + offset, t.nbytes());
    }
    device_newer_ = false;
  }

  void record(const std::vector<vk::BufferCopy>& uploads, const std::vector<vk::BufferCopy>& downloads, const std::vector<vk::BufferCopy>& updates) {
    const auto& dev = ctx_->device();
    if (!*fence_) fence_ = vk::raii::Fence(dev, vk::FenceCreateInfo());
    command_buffer_ =
        std::move(vk::raii::CommandBuffers(dev, vk::CommandBufferAllocateInfo(*ctx_->command_pool(), vk::CommandBufferLevel::ePrimary, 1))[0]);
    auto& cb = command_buffer_;
    cb.begin(vk::CommandBufferBeginInfo());
    using A = vk::AccessFlagBits;
    using S = vk::PipelineStageFlagBits;
    auto barrier = [&](vk::AccessFlags src, vk::AccessFlags dst, vk::PipelineStageFlags from, vk::PipelineStageFlags to) {
      cb.pipelineBarrier(from, to, {}, vk::MemoryBarrier(src, dst), {}, {});
    };
    // With profiling: timestamp 0 once the uploads are done, k + 1 once kernel k is done.
    auto timestamp = [&](std::size_t index) {
      if (*query_pool_) cb.writeTimestamp(S::eBottomOfPipe, *query_pool_, static_cast<std::uint32_t>(index));
    };
    if (*query_pool_) cb.resetQueryPool(*query_pool_, 0, static_cast<std::uint32_t>(kernels_.size() + 1));
    if (!uploads.empty()) cb.copyBuffer(*staging_in_.buffer, *arena_.buffer, uploads);
    if (counters_ > 0) cb.fillBuffer(*counts_.buffer, 0, VK_WHOLE_SIZE, 0);  // the flash kernels count from zero
    for (std::size_t k = 0; k < kernels_.size(); ++k)                        // and the parts of split keys arrive from zero
      if (launches_[k].split_counters > 0)
        cb.fillBuffer(*split_.buffer, static_cast<vk::DeviceSize>(kernels_[k].split_offset),
                      static_cast<vk::DeviceSize>(launches_[k].split_counters * 4), 0);
    barrier(A::eTransferWrite, A::eShaderRead | A::eShaderWrite, S::eTransfer, S::eComputeShader);
    timestamp(0);
    // A barrier only before a kernel that depends on one since the last barrier; profiling times
    // each kernel alone, so there every kernel waits for the one before.
    const std::vector<bool> wait = barriers_before(accesses());
    for (std::size_t k = 0; k < kernels_.size(); ++k) {
      const auto& kernel = kernels_[k];
      const auto& launch = launches_[k];
      if (k > 0 && (wait[k] || *query_pool_))
        barrier(A::eShaderWrite | A::eShaderRead, A::eShaderRead | A::eShaderWrite, S::eComputeShader, S::eComputeShader);
      cb.bindPipeline(vk::PipelineBindPoint::eCompute, *kernel.pipeline->pipeline);
      cb.bindDescriptorSets(vk::PipelineBindPoint::eCompute, *kernel.pipeline->layout, 0, *descriptor_sets_[k], {});
      cb.pushConstants<std::uint32_t>(*kernel.pipeline->layout, vk::ShaderStageFlagBits::eCompute, 0, launch.push);
      cb.dispatch(launch.groups[0], launch.groups[1], launch.groups[2]);
      timestamp(k + 1);
    }
    barrier(A::eShaderWrite | A::eShaderRead, A::eTransferRead | A::eTransferWrite, S::eComputeShader, S::eTransfer);
    if (!downloads.empty()) cb.copyBuffer(*arena_.buffer, *staging_out_.buffer, downloads);
    if (!updates.empty()) {
      // The outputs are read before the updated inputs are overwritten.
      barrier(A::eTransferRead, A::eTransferWrite, S::eTransfer, S::eTransfer);
      cb.copyBuffer(*arena_.buffer, *arena_.buffer, updates);
    }
    barrier(A::eTransferWrite | A::eShaderWrite, A::eHostRead | A::eShaderRead | A::eTransferRead, S::eTransfer | S::eComputeShader,
            S::eHost | S::eComputeShader | S::eTransfer);
    cb.end();
  }

  struct Kernel {
    ir::ValueId value;
    codegen::KernelSource source;
    const vulkan::Pipeline* pipeline;                 // for the bound shapes when the kernel is specialized
    int counter = -1;                                 // its tile counter in counts_, when it counts
    codegen::KernelGroup group;                       // the nodes it computes and the values it reads
    std::int64_t split_offset = 0, split_bytes = 16;  // its range of split_, where it splits keys
  };

  std::shared_ptr<Context> ctx_;
  codegen::Target target_;
  ir::StoragePlan storage_;  // per node: the dtype its storage holds, the storage it aliases or is written into
  std::vector<Kernel> kernels_;
  std::vector<codegen::KernelLaunch> launches_;  // per kernel, for shapes_
  ir::MemoryPlan memory_;
  Buffer arena_, staging_in_, staging_out_;
  Buffer counts_;                             // the flash kernels' tile counters (host-visible), one aligned slot each
  Buffer split_;                              // the flash forward's parts when it splits keys (device-local)
  int counters_ = 0;                          // kernels that count their tiles
  std::vector<TileCount> tile_counts_;        // the last run's
  std::vector<std::int64_t> staging_offset_;  // per input: its place in staging_in_, -1 when held
  std::map<std::string, std::int64_t, std::less<>> output_staging_;
  bool device_newer_ = false;  // runs have updated the held inputs since the last download
  vk::raii::DescriptorPool descriptor_pool_{nullptr};
  vk::raii::DescriptorSets descriptor_sets_{nullptr};
  vk::raii::QueryPool query_pool_{nullptr};  // kernel timestamps, when profiling
  bool profiling_ = false;
  std::vector<KernelTime> last_profile_;
  vk::raii::Fence fence_{nullptr};
  vk::raii::CommandBuffer command_buffer_{nullptr};
};

class VulkanBackend final : public Backend {
 public:
  explicit VulkanBackend(const VulkanOptions& o) : ctx_(Context::get(o)), fuse_(o.fusion) {
    const vulkan::KernelChoices choices = vulkan::choose_kernels(ctx_->profile(), o);
    target_ = choices.target;
    fusion_limits_ = choices.fusion;
    half_inputs_ = choices.half_inputs;
  }
  std::string name() const override { return "vulkan"; }
  std::string device() const override { return ctx_->device_name(); }
  std::string determinism() const override {
    return std::string(
               "every kernel: the same bits every run on this device (no atomics on floats; each sum one invocation or one fixed "
               "tree), and a sequence's the same alone or anywhere in a batch, a packed (varlen) batch's too (its keys added one at a "
               "time); not across devices or subgroup sizes, dropout's masks (keyed by the position in the batch)") +
           (target_.deterministic ? ""
                                  : ", or a packed batch on a GPU's decode layout, key split or cooperative matrices (QKV_DETERMINISTIC=1 "
                                    "keeps packed batches off them)");
  }
  /// A kernel binding more storage buffers than the device allows per shader (a flex modifier
  /// reading many tensors) is decomposed where the op has a decomposition.
  bool supports(const Node& n) const override { return vulkan::device_supports(ctx_->profile(), n); }
  ir::StoragePlan storage_plan(const ir::Graph& g) const override {
    return codegen::plan_storage(g, target_.view_alignment, target_.storage_buffers);
  }
  std::string kernel_name(const ir::Graph& g, ir::ValueId v) const override {
    const ir::StoragePlan storage = storage_plan(g);
    if (g.node(v).op == Op::input) return "(input, uploaded)";
    if (!storage.has_kernel(v)) return "(" + ir::no_kernel_reason(g, storage, v) + ")";
    if (fuse_)
      for (const auto& k : codegen::plan_kernels(g, storage, fusion_limits())) {
        if (k.root == v)
          return "glsl " + (k.fused() ? codegen::fused_name(g, storage, k, target_) : codegen::kernel_source(g, storage, v, target_).name);
        if (std::find(k.inlined.begin(), k.inlined.end(), v) != k.inlined.end() || k.beside == v)
          return g.node(v).op == Op::constant ? "(inlined where it is read)" : "(in %" + std::to_string(k.root) + "'s kernel)";
      }
    if (const ir::ValueId t = codegen::written_by_tangent(g, storage, v); t >= 0) return "(in %" + std::to_string(t) + "'s kernel)";
    return "glsl " + codegen::kernel_source(g, storage, v, target_).name;
  }
  std::string work_split(const ir::Graph& g, ir::ValueId v, const std::vector<ir::Shape>& shapes) const override {
    // A forward written by its tangent's kernel is not split (the tangent has no decode layout).
    if (codegen::written_by_tangent(g, storage_plan(g), v) >= 0) return {};
    return codegen::work_split(g, v, shapes, target_);
  }
  std::vector<ir::ValueId> kernel_reads(const ir::Graph& g, ir::ValueId v) const override {
    if (fuse_)
      for (const auto& k : codegen::plan_kernels(g, storage_plan(g), fusion_limits())) {
        if (k.root == v) return k.operands;
        if (std::find(k.inlined.begin(), k.inlined.end(), v) != k.inlined.end() || k.beside == v) return {};
      }
    if (codegen::written_by_tangent(g, storage_plan(g), v) >= 0) return {};
    return g.node(v).inputs;
  }
  const codegen::FusionLimits& fusion_limits() const { return fusion_limits_; }
  /// The shaders compile(g) runs (codegen::emit_glsl for this device).
  /// The GLSL the device would run for g, without creating its pipelines.
  std::string shaders(const ir::Graph& g) const {
    const ir::Graph lowered = ir::lower_for_backend(
        g, [this](const Node& n) { return supports(n); }, half_inputs_);
    return codegen::emit_glsl(lowered, storage_plan(lowered), fusion_limits(), target_, fuse_);
  }
  std::unique_ptr<Executable> compile(const ir::Graph& g) override {
    // With 16-bit storage, half inputs and outputs cross as they are (cast kernels convert them
    // on the device); the half-precision boundary converts only what the lowering declares f32.
    ir::Graph lowered = ir::lower_for_backend(
        g, [this](const Node& n) { return supports(n); }, half_inputs_);
    for (const Node& n : lowered.nodes())
      if (auto why = codegen::unsupported_reason(lowered, n)) throw UnsupportedError("vulkan: " + *why);
    return half_precision_boundary(
        g, std::make_unique<VulkanExecutable>(ctx_, std::move(lowered), target_, fuse_ ? std::optional(fusion_limits()) : std::nullopt));
  }

 private:
  std::shared_ptr<Context> ctx_;
  codegen::Target target_;
  codegen::FusionLimits fusion_limits_;
  bool fuse_ = true;
  ir::HalfInputs half_inputs_ = ir::HalfInputs::widened;
};

}  // namespace

bool vulkan_supports(const ir::Node& n) { return codegen::implements(n); }

std::unique_ptr<Backend> make_vulkan_backend(const VulkanOptions& options) { return std::make_unique<VulkanBackend>(options); }

std::string vulkan_shaders(const ir::Graph& g, const VulkanOptions& options) {
  std::unique_ptr<VulkanBackend> device;
  try {
    device = std::make_unique<VulkanBackend>(options);
  } catch (const BackendError&) {  // no device here: what a GPU with common limits would run
  }
  if (device) return device->shaders(g);
  // No device here: what a GPU of the most common family would run (NVIDIA's limits, without
  // cooperative matrices, whose kernels need f16 graphs).
  const std::vector<vulkan::DeviceProfile> families = vulkan::device_families();
  const auto gpu = std::find_if(families.begin(), families.end(), [](const auto& d) { return d.cooperative_fragment[0] == 0 && !d.cpu_device; });
  QKV_ASSERT(gpu != families.end(), "device_families() lists no GPU without cooperative matrices");
  VulkanOptions o = options;
  o.cooperative_matrix = VulkanOptions::CooperativeMatrix::off;
  const vulkan::KernelChoices choices = vulkan::choose_kernels(*gpu, o);
  const ir::Graph lowered = ir::lower_for_backend(
      g, [&](const Node& n) { return vulkan::device_supports(*gpu, n); }, choices.half_inputs);
  return "// No Vulkan device here: the shaders for a GPU like " + gpu->name + ",\n// storage offsets aligned to " +
         std::to_string(choices.target.view_alignment) + " bytes.\n" +
         codegen::emit_glsl(lowered, codegen::plan_storage(lowered, choices.target.view_alignment, choices.target.storage_buffers), choices.fusion,
                            choices.target, options.fusion);
}

std::string VulkanDeviceInfo::capabilities() const {
  auto yes = [](bool b) { return b ? "yes" : "no"; };
  std::string ops;
  if (subgroup_arithmetic) ops += "arithmetic";
  if (subgroup_shuffle) ops += std::string(ops.empty() ? "" : ", ") + "shuffle";
  return "subgroup " + std::to_string(subgroup_size) + " (" + (ops.empty() ? "basic" : ops) + "), " + std::to_string(shared_memory_bytes / 1024) +
         " KiB shared memory, " + std::to_string(max_invocations) + " invocations per workgroup, f16 " + yes(float16) + ", int8 " + yes(int8) +
         ", 16-bit storage " + yes(storage16) + ", cooperative matrix " +
         (cooperative_fragment[0] != 0 ? "f16 " + std::to_string(cooperative_fragment[0]) + "x" + std::to_string(cooperative_fragment[1]) + "x" +
                                             std::to_string(cooperative_fragment[2]) +
                                             (cooperative_khr ? " (VK_KHR, the kernels translated from NV's SPIR-V; f16 matmuls and attention use it)"
                                                              : " (VK_NV, f16 matmuls and attention use it)")
          : cooperative_matrix ? std::string("yes (no f16 x f16 into f32 fragment, or no Vulkan memory model with Device scope: unused)")
                               : std::string("no")) +
         ", Vulkan memory model " +
         (memory_model_device_scope ? "with Device scope"
          : memory_model            ? "without Device scope"
                                    : "no") +
         ", timestamps " + yes(timestamps);
}

std::vector<VulkanDeviceInfo> vulkan_devices() {
  return guarded("device listing", [] {
    vk::raii::Context context;
    vk::ApplicationInfo app("qkv", 1, "qkv", 1, VK_API_VERSION_1_1);
    vk::raii::Instance instance(context, vk::InstanceCreateInfo({}, &app));
    std::vector<VulkanDeviceInfo> r;
    for (auto& d : vk::raii::PhysicalDevices(instance)) {
      VulkanDeviceInfo info;
      const auto p = d.getProperties();
      const vulkan::SubgroupSupport sub = vulkan::subgroup_support(d);
      info.name = p.deviceName.data();
      info.type = vulkan::device_type_name(p.deviceType);
      info.api = std::to_string(VK_API_VERSION_MAJOR(p.apiVersion)) + "." + std::to_string(VK_API_VERSION_MINOR(p.apiVersion));
      info.subgroup_size = sub.size;
      info.subgroup_arithmetic = sub.arithmetic;
      info.subgroup_shuffle = sub.shuffle;
      info.shared_memory_bytes = p.limits.maxComputeSharedMemorySize;
      info.max_invocations = p.limits.maxComputeWorkGroupInvocations;
      // Feature structures are chained only where the device has their extension.
      std::vector<std::string> extensions;
      for (const auto& e : d.enumerateDeviceExtensionProperties()) extensions.emplace_back(e.extensionName.data());
      auto has = [&](std::string_view name) { return std::find(extensions.begin(), extensions.end(), name) != extensions.end(); };
      if (has("VK_KHR_shader_float16_int8")) {
        const auto f = d.getFeatures2<vk::PhysicalDeviceFeatures2, vk::PhysicalDeviceShaderFloat16Int8Features>();
        info.float16 = f.get<vk::PhysicalDeviceShaderFloat16Int8Features>().shaderFloat16;
        info.int8 = f.get<vk::PhysicalDeviceShaderFloat16Int8Features>().shaderInt8;
      }
      if (has("VK_KHR_16bit_storage") || p.apiVersion >= VK_API_VERSION_1_1)
        info.storage16 = d.getFeatures2<vk::PhysicalDeviceFeatures2, vk::PhysicalDevice16BitStorageFeatures>()
                             .get<vk::PhysicalDevice16BitStorageFeatures>()
                             .storageBuffer16BitAccess;
      info.cooperative_matrix = has("VK_KHR_cooperative_matrix") || has("VK_NV_cooperative_matrix");
      const vulkan::MemoryModelSupport model = vulkan::memory_model_support(d);
      info.memory_model = model.model;
      info.memory_model_device_scope = model.device_scope;
      const vulkan::CooperativeOffer offer = vulkan::offered_fragment(instance, d, false);
      info.cooperative_fragment = offer.fragment;
      info.cooperative_khr = offer.khr;
      for (const auto& q : d.getQueueFamilyProperties())
        if (q.queueFlags & vk::QueueFlagBits::eCompute) {
          info.timestamps = q.timestampValidBits != 0 && p.limits.timestampPeriod > 0;
          break;
        }
      r.push_back(std::move(info));
    }
    return r;
  });
}

}  // namespace qkv::backend
