mod device;
