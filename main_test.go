package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/provider"
)

// Without any TF_LOG* variable the provider's own logger is off too: terraform-plugin-go reads its
// level from TF_LOG_PROVIDER_<TYPE> and logs at TRACE when that is unset.
func TestQuietUnlessAskedTurnsOffTheProvidersOwnLogger(t *testing.T) {
	require.Equal(t, "TF_LOG_PROVIDER_TAKOFORM", providerLogVariable(provider.Address))
	require.Equal(t, "TF_LOG_PROVIDER_MY_PROVIDER", providerLogVariable("registry.terraform.io/someone/my-provider"))

	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "TF_LOG") || strings.HasPrefix(name, "TF_ACC_LOG") {
			t.Setenv(name, "")
			require.NoError(t, os.Unsetenv(name))
		}
	}
	for _, name := range []string{"TF_LOG_PROVIDER", "TF_LOG_PROVIDER_TAKOFORM", "TF_LOG_SDK", "TF_LOG_SDK_PROTO", "TF_LOG_SDK_FRAMEWORK"} {
		t.Setenv(name, "") // restored after the test
		require.NoError(t, os.Unsetenv(name))
	}
	quietUnlessAsked()
	require.Equal(t, "OFF", os.Getenv("TF_LOG_PROVIDER_TAKOFORM"))
	require.Equal(t, "OFF", os.Getenv("TF_LOG_SDK_FRAMEWORK"))

	// Asked for logs, it leaves every level as the user set it.
	t.Setenv("TF_LOG_PROVIDER_TAKOFORM", "")
	require.NoError(t, os.Unsetenv("TF_LOG_PROVIDER_TAKOFORM"))
	t.Setenv("TF_LOG", "DEBUG")
	quietUnlessAsked()
	_, set := os.LookupEnv("TF_LOG_PROVIDER_TAKOFORM")
	require.False(t, set)
}
