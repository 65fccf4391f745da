//! Which graph features the loaded driver has: each needs entry points that older drivers (or
//! injection libraries that forward only what they know) lack, and asking for one of them gives
//! an error naming every missing entry point before anything is changed.

use crate::driver::calls;
use crate::error::{AtlasError, GraphFeature, Result};

/// `Ok` when the driver has every entry point `feature` needs, else the error naming the ones it
/// lacks.
pub(crate) fn require(feature: GraphFeature) -> Result<()> {
    let missing = match feature {
        GraphFeature::Update => calls::missing_graph_update()?,
        GraphFeature::Conditional => calls::missing_conditional()?,
    };
    if missing.is_empty() {
        Ok(())
    } else {
        Err(AtlasError::GraphFeatureUnavailable { feature, missing })
    }
}
