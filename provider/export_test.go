package provider

// ActivationToken lets the acceptance tests act on an activation behind the provider's back.
var ActivationToken = activationToken

// DefaultReservationID is the id of a reservation created without one.
var DefaultReservationID = defaultReservationID

// CalleeReplaced is the service bindings' replacement decision.
var CalleeReplaced = calleeReplaced
