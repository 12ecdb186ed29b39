#include "oracle/oracle.hpp"

namespace accumcheck {

static_assert(Engine<Oracle<OracleReal>>);
static_assert(Engine<Oracle<Tracked<OracleReal>>>);
static_assert(Engine<Oracle<float>>);
static_assert(Engine<Oracle<Tracked<DD>>>);

template class Oracle<OracleReal>;
template class Oracle<Tracked<OracleReal>>;
template class Oracle<Tracked<BoundReal>>;
template class Oracle<Tracked<DD>>;
template class Oracle<double>;

}  // namespace accumcheck
