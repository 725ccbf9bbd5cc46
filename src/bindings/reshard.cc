// jax_amem._core.reshard: the native planner. Thin: arrays in, arrays out.
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

// Rows of an array, after checking it has `columns` columns (1: a vector).
int64_t Rows(const In& a, size_t columns, const char* name) {
  const size_t total = a.size();
  if (columns == 0 || total % columns != 0 || (a.ndim() == 2 && a.shape(1) != columns)) {
    throw nb::value_error((std::string("reshard.plan: array ") + name + " has the wrong shape").c_str());
  }
  return static_cast<int64_t>(total / columns);
}

}  // namespace

void BindReshard(nb::module_& root) {
  nb::module_ m = root.def_submodule("reshard", "Resharding planner (native part)");
  m.attr("RANK") = reshard::kRank;
  m.def(
      "plan",
      [](In owners, In layout_shape, In box_begin, In box_start, In box_size, In rep_begin, In rep_owner,
         In src_layout, In dst_layout, In dst_itemsize, In view_src, In view_perm, In view_itemsize,
         In piece_dst, In piece_view, In piece_dst_start, In piece_src_start, In piece_size,
         int64_t split_bytes, int64_t owner) {
        constexpr size_t R = reshard::kRank;
        reshard::Problem pb;
        pb.owners = owners.data();
        pb.num_owners = Rows(owners, 2, "owners");
        pb.layout_shape = layout_shape.data();
        pb.num_layouts = Rows(layout_shape, R, "layout_shape");
        if (Rows(box_begin, 1, "box_begin") != pb.num_layouts + 1) throw nb::value_error("box_begin length");
        pb.box_begin = box_begin.data();
        pb.box_start = box_start.data();
        pb.num_boxes = Rows(box_start, R, "box_start");
        if (Rows(box_size, R, "box_size") != pb.num_boxes) throw nb::value_error("box_size rows");
        pb.box_size = box_size.data();
        if (Rows(rep_begin, 1, "rep_begin") != pb.num_boxes + 1) throw nb::value_error("rep_begin length");
        pb.rep_begin = rep_begin.data();
        pb.rep_owner = rep_owner.data();
        pb.num_reps = Rows(rep_owner, 1, "rep_owner");
        pb.src_layout = src_layout.data();
        pb.num_src = Rows(src_layout, 1, "src_layout");
        pb.dst_layout = dst_layout.data();
        pb.num_dst = Rows(dst_layout, 1, "dst_layout");
        if (Rows(dst_itemsize, 1, "dst_itemsize") != pb.num_dst) throw nb::value_error("dst_itemsize length");
        pb.dst_itemsize = dst_itemsize.data();
        pb.view_src = view_src.data();
        pb.num_views = Rows(view_src, 1, "view_src");
        if (Rows(view_perm, R, "view_perm") != pb.num_views || Rows(view_itemsize, 1, "view_itemsize") != pb.num_views) {
          throw nb::value_error("view arrays differ in length");
        }
        pb.view_perm = view_perm.data();
        pb.view_itemsize = view_itemsize.data();
        pb.num_pieces = Rows(piece_dst, 1, "piece_dst");
        if (Rows(piece_view, 1, "piece_view") != pb.num_pieces || Rows(piece_dst_start, R, "piece_dst_start") != pb.num_pieces ||
            Rows(piece_src_start, R, "piece_src_start") != pb.num_pieces || Rows(piece_size, R, "piece_size") != pb.num_pieces) {
          throw nb::value_error("piece arrays differ in length");
        }
        pb.piece_dst = piece_dst.data();
        pb.piece_view = piece_view.data();
        pb.piece_dst_start = piece_dst_start.data();
        pb.piece_src_start = piece_src_start.data();
        pb.piece_size = piece_size.data();
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
      "Plans the problem laid out by jax_amem.reshard.problem (owner < 0: the global plan). "
      "Returns (transfers (T, 7), blocks (B, 9)) int64.");
}

}  // namespace amem::bindings
