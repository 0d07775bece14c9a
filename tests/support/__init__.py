"""Programs and fixtures the tests share: local servers, launch scripts."""
