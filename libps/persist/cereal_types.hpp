#pragma once
// cereal's view of the state types that travel as bytes: checkpoint sections
// (libps/persist/checkpoint.cpp) and shard handoffs (libps/core/handoff.cpp) share one encoding.
#include <cereal/types/vector.hpp>

#include "libps/persist/snapshot_types.hpp"

namespace ps {

template <class Archive>
void serialize(Archive& ar, stored_segment& s) {
  ar(s.begin, s.end, s.values, s.state);
}
template <class Archive>
void serialize(Archive& ar, table_rows& t) {
  ar(t.table, t.stride, t.ids, t.rows);
}

}  // namespace ps
