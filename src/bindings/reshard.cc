// jax_amem_core._core.reshard: the native planner. Thin: arrays in, arrays out.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>

#include <string>
#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "reshard/problem.h"

namespace nb = nanobind;

namespace amem::bindings {
namespace {

using In = nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>;
using Out = nb::ndarray<nb::numpy, int64_t, nb::ndim<2>>;

Out ToNumpy(std::vector<int64_t> values, size_t columns) {
  auto* owned = new std::vector<int64_t>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
  return Out(owned->data(), {owned->size() / columns, columns}, owner);
}

// A field of the problem: an int64 C-contiguous array of `columns` columns (1: a vector),
// read by name so that Python and C++ never depend on an order of arguments.
struct Field {
  const int64_t* data;
  int64_t rows;
};

Field Get(const nb::dict& problem, const char* name, size_t columns) {
  if (!problem.contains(name)) {
    throw nb::key_error((std::string("reshard.plan: the problem has no field ") + name).c_str());
  }
  In array;
  if (!nb::try_cast(problem[name], array, /*convert=*/false)) {
    throw nb::type_error((std::string("reshard.plan: field ") + name +
                          " must be a C-contiguous int64 numpy array").c_str());
  }
  const size_t total = array.size();
  if (total % columns != 0 || (array.ndim() == 2 && array.shape(1) != columns)) {
    throw nb::value_error((std::string("reshard.plan: field ") + name + " has the wrong shape").c_str());
  }
  return {array.data(), static_cast<int64_t>(total / columns)};
}

// The field, after checking it has `rows` rows.
const int64_t* GetRows(const nb::dict& problem, const char* name, size_t columns, int64_t rows) {
  Field field = Get(problem, name, columns);
  if (field.rows != rows) {
    throw nb::value_error((std::string("reshard.plan: field ") + name + " has " +
                           std::to_string(field.rows) + " rows, not " + std::to_string(rows))
                              .c_str());
  }
  return field.data;
}

}  // namespace

void BindReshard(nb::module_& root) {
  nb::module_ m = root.def_submodule("reshard", "Resharding planner (native part)");
  m.attr("RANK") = reshard::kRank;
  m.def(
      "plan",
      [](const nb::dict& problem, int64_t split_bytes, int64_t owner) {
        constexpr size_t R = reshard::kRank;
        reshard::Problem pb;
        Field owners = Get(problem, "owners", 2);
        pb.owners = owners.data;
        pb.num_owners = owners.rows;
        Field layout_shape = Get(problem, "layout_shape", R);
        pb.layout_shape = layout_shape.data;
        pb.num_layouts = layout_shape.rows;
        pb.box_begin = GetRows(problem, "box_begin", 1, pb.num_layouts + 1);
        Field box_start = Get(problem, "box_start", R);
        pb.box_start = box_start.data;
        pb.num_boxes = box_start.rows;
        pb.box_size = GetRows(problem, "box_size", R, pb.num_boxes);
        pb.rep_begin = GetRows(problem, "rep_begin", 1, pb.num_boxes + 1);
        Field rep_owner = Get(problem, "rep_owner", 1);
        pb.rep_owner = rep_owner.data;
        pb.num_reps = rep_owner.rows;
        Field src_layout = Get(problem, "src_layout", 1);
        pb.src_layout = src_layout.data;
        pb.num_src = src_layout.rows;
        Field dst_layout = Get(problem, "dst_layout", 1);
        pb.dst_layout = dst_layout.data;
        pb.num_dst = dst_layout.rows;
        pb.dst_itemsize = GetRows(problem, "dst_itemsize", 1, pb.num_dst);
        Field view_src = Get(problem, "view_src", 1);
        pb.view_src = view_src.data;
        pb.num_views = view_src.rows;
        pb.view_perm = GetRows(problem, "view_perm", R, pb.num_views);
        pb.view_itemsize = GetRows(problem, "view_itemsize", 1, pb.num_views);
        Field piece_dst = Get(problem, "piece_dst", 1);
        pb.piece_dst = piece_dst.data;
        pb.num_pieces = piece_dst.rows;
        pb.piece_view = GetRows(problem, "piece_view", 1, pb.num_pieces);
        pb.piece_dst_start = GetRows(problem, "piece_dst_start", R, pb.num_pieces);
        pb.piece_src_start = GetRows(problem, "piece_src_start", R, pb.num_pieces);
        pb.piece_size = GetRows(problem, "piece_size", R, pb.num_pieces);
        if (split_bytes < 1) throw nb::value_error("split_bytes must be >= 1");
        pb.split_bytes = split_bytes;
        reshard::PlanTables tables;
        Status status;
        {
          nb::gil_scoped_release release;  // planning is pure C++ on arrays Python keeps alive
          status = reshard::Plan(pb, owner, &tables);
        }
        if (!status.ok()) throw nb::value_error(status.message().c_str());
        return std::make_pair(ToNumpy(std::move(tables.transfers), reshard::kTransferColumns),
                              ToNumpy(std::move(tables.blocks), reshard::kBlockColumns));
      },
      nb::arg("problem"), nb::arg("split_bytes"), nb::arg("owner"),
      "Plans the problem laid out by jax_amem.reshard.problem: `problem` maps each field's name "
      "(owners, layout_shape, box_begin, ...) to a C-contiguous int64 array; owner < 0: the "
      "global plan. Returns (transfers (T, 7), blocks (B, 9)) int64.");
}

}  // namespace amem::bindings
